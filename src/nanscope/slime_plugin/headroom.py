"""The step's headroom on this rank: how close its loss came to overflowing, from what the loss watch saw.

Per micro-batch the loss watch holds the batch slime's policy loss received and the current policy's per-token
log-probs as the release computed them; `measure` turns the step's micro-batches into one row of numbers (0-dim
device tensors stacked, no host sync), the formulas being `nanscope.loss.headroom`'s:

    kl     max of ref - logp        (where the KL term takes its exp: --use-kl-loss with --kl-loss-type k3 or
                                     low_var_kl; k1 and k2 have none)
    ppo    max of logp - old        (old: log_probs, or rollout_log_probs under --use-rollout-logprobs)
    tis    max of old - rollout     (where the TIS weight is computed: --use-tis, or --get-mismatch-metrics from
                                     v0.2.4, loss.py:712; the batch has rollout_log_probs)
    gap    |logp - rollout| over trained tokens (loss_mask 1): sum, count, 99th percentile (the largest
           micro-batch's), max
    clamped  tokens with a log-ratio beyond the guard's ±20 (of those that reach an exp)
    nonfinite_inputs  non-finite entries of the per-token loss inputs (log-probs, advantages)

A maximum carries the micro-batch and the sample (in that micro-batch) that holds it. Every token counts,
masked ones too (slime computes exp on them), except for the gap.

No host sync and no temporary larger than a micro-batch's per-token tensors ([N] for N local tokens, against
the logits' [N, V/TP]): Python numbers reach the device as fills or pinned non-blocking copies
(`nanscope.loss.devices.to_device`), never `torch.tensor(..., device=)`; masks select with `torch.where`, never boolean indexing; a 0-dim index is taken
with index_select, never `x[i]` (which reads it on the host).
"""

from __future__ import annotations

import torch

from nanscope.facts.keys import PER_TOKEN
from nanscope.loss import devices, guard
from nanscope.loss import headroom as formulas
from nanscope.loss.target import Target
from nanscope.slime_plugin.loss_watch import Seen

MAXIMA = ("kl", "ppo", "tis", "gap")
# One rank's row: each maximum as (value, micro-batch, sample), then the gap's sum, count and p99, then the
# clamped tokens. `step_vote` reads it by these names.
FIELDS = tuple(f"{m}_{part}" for m in MAXIMA for part in ("value", "microbatch", "sample")) + (
    "gap_sum",
    "gap_count",
    "gap_p99",
    "clamped",
    "nonfinite_inputs",
)


def measure(seen: list[Seen], target: Target, device) -> torch.Tensor:
    """[len(FIELDS)] float32 on `device`: this rank's step, over every micro-batch the loss watch saw."""
    parts: dict[str, list] = {m: [] for m in MAXIMA}
    sums, counts, p99s, clamped = [], [], [], []
    for mb in seen:
        if mb.logp is None:  # the release's log-prob helper was not reached: nothing current to compare
            continue
        batch, args, logp = mb.batch, mb.args, mb.logp
        positions = guard.response_positions(target, args, batch, mb.parallel)
        sizes = devices.to_device(torch.tensor([len(p) for p in positions]), logp.device)
        ratios = _log_ratios(batch, args, logp)
        for name, ratio in ratios.items():
            parts[name].append((formulas.maximum(ratio, sizes), _microbatch(mb)))
        clamped.append(formulas.clamped(list(ratios.values())) if ratios else _full(0.0, logp.device))
        if "rollout_log_probs" in batch and batch["rollout_log_probs"]:
            gap = formulas.train_rollout_gap(logp, _cat(batch["rollout_log_probs"], logp.device))
            trained = guard.local_entries(batch["loss_masks"], positions).to(logp.device) != 0
            parts["gap"].append((formulas.maximum(gap, sizes, trained), _microbatch(mb)))
            sums.append(torch.where(trained, gap, 0.0).sum())
            counts.append(trained.sum())
            p99s.append(_p99(gap, trained))
    row = []
    for name in MAXIMA:
        row += _largest(parts[name], device)
    count = torch.stack(counts).sum() if counts else _full(0.0, device)
    row += [torch.stack(sums).sum() if sums else _full(0.0, device), count, _worst(p99s, device)]
    row.append(torch.stack(clamped).sum() if clamped else _full(0.0, device))
    row.append(_nonfinite(seen, device))
    return torch.stack([torch.as_tensor(x, device=device).float().reshape(()) for x in row])


def _p99(gap: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """0-dim: the 99th percentile of `gap` [N] over the `trained` [N] tokens: NaN if one of them is NaN, -inf
    for none (nanquantile over the untrained set to NaN: no boolean indexing, no host sync)."""
    values = torch.where(trained, gap.float(), float("nan"))
    nan = (torch.isnan(gap) & trained).any()
    none = ~trained.any()
    q = torch.nanquantile(values, 0.99) if values.numel() else _full(float("nan"), gap.device)
    return torch.where(nan, float("nan"), torch.where(none, float("-inf"), q))


def _worst(p99s: list[torch.Tensor], device) -> torch.Tensor:
    """The largest micro-batch 99th percentile (a NaN is the largest; -inf for none)."""
    if not p99s:
        return _full(float("-inf"), device)
    values = torch.stack(p99s)
    return torch.where(torch.isnan(values).any(), float("nan"), values.max())


def empty(device) -> torch.Tensor:
    """The row of a step with nothing measured."""
    return measure([], None, device)


def _log_ratios(batch: dict, args, logp: torch.Tensor) -> dict[str, torch.Tensor]:
    """The log-ratios this micro-batch's loss exponentiates ([N] each), by name."""
    device, out = logp.device, {}
    rollout = batch.get("rollout_log_probs") or None
    old_key = "rollout_log_probs" if getattr(args, "use_rollout_logprobs", False) else "log_probs"
    if batch.get(old_key):
        out["ppo"] = formulas.ppo_log_ratio(logp, _cat(batch[old_key], device))
    kl_exp = getattr(args, "use_kl_loss", False) and getattr(args, "kl_loss_type", None) in formulas.KL_EXPONENTIATED
    if kl_exp and batch.get("ref_log_probs"):
        out["kl"] = formulas.kl_log_ratio(logp, _cat(batch["ref_log_probs"], device))
    tis_exp = getattr(args, "use_tis", False) or getattr(args, "get_mismatch_metrics", False)
    if tis_exp and rollout is not None and batch.get("log_probs"):
        out["tis"] = formulas.tis_log_ratio(_cat(batch["log_probs"], device), _cat(rollout, device))
    return out


def _largest(found: list, device) -> list[torch.Tensor]:
    """(value, micro-batch, sample) of the largest of this step's per-micro-batch maxima (-inf, -1, -1 if none)."""
    if not found:
        return [_full(value, device) for value in (float("-inf"), -1.0, -1.0)]
    values = torch.stack([m.value for m, _ in found])
    nan = torch.isnan(values)
    at = torch.where(nan.any(), nan.int().argmax(), values.argmax()).reshape(1)
    samples = torch.stack([m.sample for m, _ in found]).float()
    microbatches = devices.to_device(torch.tensor([float(index) for _, index in found]), values.device)
    return [t.index_select(0, at)[0] for t in (values, microbatches, samples)]


def _nonfinite(seen: list[Seen], device) -> torch.Tensor:
    """0-dim: non-finite entries of the per-token loss inputs the step's micro-batches carried."""
    found = [(~torch.isfinite(_cat(mb.batch[k], device))).sum() for mb in seen for k in PER_TOKEN if mb.batch.get(k)]
    return torch.stack(found).sum() if found else torch.zeros((), device=device)


def _full(value: float, device) -> torch.Tensor:
    """A 0-dim float32 on `device`, filled there (torch.tensor(value, device=) copies from the host and waits)."""
    return torch.full((), value, dtype=torch.float32, device=device)


def _microbatch(mb: Seen) -> int:
    return mb.microbatch if mb.microbatch is not None else mb.index


def _cat(parts, device) -> torch.Tensor:
    return devices.to_device(torch.cat([torch.as_tensor(p).reshape(-1) for p in parts]), device)
