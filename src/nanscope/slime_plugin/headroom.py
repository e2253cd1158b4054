"""The step's headroom on this rank: how close its loss came to overflowing, from what the loss watch saw.

Per micro-batch the loss watch holds the batch slime's policy loss received and the current policy's per-token
log-probs as the release computed them; `measure` turns the step's micro-batches into one row of numbers (0-dim
device tensors stacked, no host sync), the formulas being `nanscope.loss.headroom`'s:

    kl     max of ref - logp        (when the loss reads ref_log_probs: --use-kl-loss)
    ppo    max of logp - old        (old: log_probs, or rollout_log_probs under --use-rollout-logprobs)
    tis    max of old - rollout     (when the batch has rollout_log_probs)
    gap    |logp - rollout| over trained tokens (loss_mask 1): sum, count, 99th percentile, max
    clamped  tokens with a log-ratio beyond the guard's ±20
    nonfinite_inputs  non-finite entries of the per-token loss inputs (log-probs, advantages)

A maximum carries the micro-batch and the sample (in that micro-batch) that holds it. Every token counts,
masked ones too (slime computes exp on them), except for the gap.
"""

from __future__ import annotations

import torch

from nanscope.facts.keys import PER_TOKEN
from nanscope.loss import guard
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
    gaps, clamped = [], []
    for mb in seen:
        if mb.logp is None:  # the release's log-prob helper was not reached: nothing current to compare
            continue
        batch, args, logp = mb.batch, mb.args, mb.logp
        positions = guard.response_positions(target, args, batch, mb.parallel)
        sizes = torch.tensor([len(p) for p in positions], device=logp.device)
        ratios = _log_ratios(batch, args, logp)
        for name, ratio in ratios.items():
            parts[name].append((formulas.maximum(ratio, sizes), _microbatch(mb)))
        clamped.append(formulas.clamped(list(ratios.values())) if ratios else torch.zeros((), device=logp.device))
        if "rollout_log_probs" in batch and batch["rollout_log_probs"]:
            gap = formulas.train_rollout_gap(logp, _cat(batch["rollout_log_probs"], logp.device))
            trained = guard.local_entries(batch["loss_masks"], positions).to(logp.device) != 0
            parts["gap"].append((formulas.maximum(gap, sizes, trained), _microbatch(mb)))
            gaps.append(gap[trained])
    row = []
    for name in MAXIMA:
        row += _largest(parts[name], device)
    gap = torch.cat(gaps) if gaps else torch.zeros(0, device=device)
    row += [gap.sum(), torch.tensor(float(gap.numel()), device=device), formulas.quantile(gap, 0.99)]
    row.append(torch.stack(clamped).sum() if clamped else torch.zeros((), device=device))
    row.append(_nonfinite(seen, device))
    return torch.stack([torch.as_tensor(x, device=device).float().reshape(()) for x in row])


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
    if getattr(args, "use_kl_loss", False) and batch.get("ref_log_probs"):
        out["kl"] = formulas.kl_log_ratio(logp, _cat(batch["ref_log_probs"], device))
    if rollout is not None and batch.get("log_probs"):
        out["tis"] = formulas.tis_log_ratio(_cat(batch["log_probs"], device), _cat(rollout, device))
    return out


def _largest(found: list, device) -> list[torch.Tensor]:
    """(value, micro-batch, sample) of the largest of this step's per-micro-batch maxima (-inf, -1, -1 if none)."""
    if not found:
        return [torch.tensor(value, device=device) for value in (float("-inf"), -1.0, -1.0)]
    values = torch.stack([m.value for m, _ in found])
    nan = torch.isnan(values)
    at = torch.where(nan.any(), nan.int().argmax(), values.argmax())
    samples = torch.stack([m.sample for m, _ in found])
    microbatches = torch.tensor([index for _, index in found], device=values.device)
    return [values[at], microbatches[at].float(), samples[at].float()]


def _nonfinite(seen: list[Seen], device) -> torch.Tensor:
    """0-dim: non-finite entries of the per-token loss inputs the step's micro-batches carried."""
    found = [(~torch.isfinite(_cat(mb.batch[k], device))).sum() for mb in seen for k in PER_TOKEN if mb.batch.get(k)]
    return torch.stack(found).sum() if found else torch.zeros((), device=device)


def _microbatch(mb: Seen) -> int:
    return mb.microbatch if mb.microbatch is not None else mb.index


def _cat(parts, device) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p).reshape(-1) for p in parts]).to(device)
