"""The guard: a slime loss module's own policy loss, made NaN-safe around the call (the plugin's and `safe`'s).

`call(target, ...)` calls the target's policy loss (a slime release's, or nanscope's model of v0.1.0:
`nanscope.loss.target`) with three layers around the call and nothing re-implemented:

1. Inputs. Non-finite old/ref/rollout log-probs become 0 and their tokens leave the loss; a non-finite
   advantage removes its whole sample. The tokens are cut out of a copy of `loss_masks` (response
   positions found with the release's own CP slicer) and out of slime's sample-mean reducer. Every batch
   takes the same device ops and no host sync (a step's one sync is the plugin's vote): finite entries and
   the masks of finite tokens come out bit for bit as they went in. nan_policy "strict" raises instead,
   naming the sample and response token (its check is one host sync per call).
2. Exp. While the call runs, the loss module's helpers that exponentiate a log-ratio (PPO ratio, KL
   estimators, cispo) get it clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] = [-20, 20] first, and so
   does the module's inline `torch.exp` (TIS, icepop, unbiased KL). They are restored afterwards, also
   on an exception. exp can then not overflow, so no inf derivative meets a zero gradient; the bound
   never binds on healthy data, where the call is the release's own, op for op.
3. Reducer. slime's sum_of_sample_mean multiplies by the mask, so a masked inf still makes NaN; the
   reducer the release receives selects instead (torch.where), which is exact on finite values.

The metrics are the release's own plus `nan_guard/*` counters (token or sample counts of this micro-batch).
"""

from __future__ import annotations

import contextlib

import torch

from nanscope.facts.numerics import FP32_EXP_MAX, LOG_RATIO_BOUND
from nanscope.facts.releases import EXP_NEG_FIRST, EXP_SECOND_MINUS_FIRST
from nanscope.loss import layout
from nanscope.loss.microbatch import Parallel
from nanscope.loss.target import Target

NAN_POLICIES = ("drop", "strict")


class NonFiniteInputError(ValueError):
    """A non-finite log-prob or advantage reached the loss under nan_policy='strict'."""


def call(target: Target, args, batch: dict, logits, sum_of_sample_mean, *, nan_policy="drop", parallel=None):
    """Call `target`'s policy loss inside the three layers (see the module docstring).

    Args:
        target: the loss module to wrap (target.running(), target.bind(...) or target.model()).
        args, batch, logits, sum_of_sample_mean: as slime passes them to a custom loss.
        nan_policy: "drop" or "strict".
        parallel: nanscope's model only: its nanscope.loss.microbatch.Parallel (default: megatron's
            parallel state); slime reads megatron's parallel state itself.

    Returns:
        (loss, metrics) with nan_guard/* counters added.
    """
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy {nan_policy!r}: expected one of {', '.join(NAN_POLICIES)}")
    kwargs = {}
    if target.slicer is None:
        kwargs["parallel"] = parallel = parallel or Parallel.from_megatron()
    positions = response_positions(target, args, batch, parallel)
    keys = target.release.reads(args)
    guard = _Inputs(batch, keys, positions, logits.device)
    if nan_policy == "strict" and guard.any_nonfinite():
        raise NonFiniteInputError(guard.first_nonfinite())
    clean = guard.cleaned()
    keep = guard.keep_local(clean["loss_masks"])  # [N] bool, this rank's tokens that stay in the loss

    def select(x):
        return sum_of_sample_mean(torch.where(keep, x, 0.0))

    overflow = _Overflow(keep.numel(), logits.device)
    with _patched(target, overflow):
        loss, metrics = target.entry(args, clean, logits, select, **kwargs)
    metrics.update(guard.counters(keep, overflow.count(guard.input_finite())))
    return loss, metrics


def response_positions(target: Target, args, batch: dict, parallel=None) -> list[list[int]]:
    """Per sample, the response position of each of this CP rank's tokens, in the rank's order."""
    lengths = zip(batch["total_lengths"], batch["response_lengths"])
    if target.slicer is None:  # nanscope's model: its Parallel holds the CP coordinate
        parallel = parallel or Parallel.from_megatron()
        return [layout.response_positions(t, r, parallel.cp_rank, parallel.cp_size) for t, r in lengths]
    if not target.release.slicer_takes_format:
        return [list(target.slicer(list(range(r)), t, r)) for t, r in lengths]
    max_lens = batch.get("max_seq_lens") or [None] * len(batch["total_lengths"])
    return [list(target.slicer(list(range(r)), t, r, args.qkv_format, m)) for (t, r), m in zip(lengths, max_lens)]


class _Inputs:
    """The per-token inputs the release reads, their non-finite entries, and the batch without them. Nothing here
    waits for the device but `any_nonfinite` (strict's check) and `first_nonfinite` (its message)."""

    def __init__(self, batch: dict, keys: tuple[str, ...], positions: list[list[int]], device):
        self.batch, self.keys, self.positions, self.device = batch, keys, positions, device
        self.present = [k for k in keys if batch.get(k)]
        self.sizes = [len(p) for p in positions]

    def any_nonfinite(self) -> bool:
        """Some read input is non-finite (one host sync: nan_policy "strict" only)."""
        flags = [torch.isfinite(_cat(self.batch[k])).all() for k in self.present]
        return not bool(torch.stack(flags).all()) if flags else False

    def _finite(self, key) -> list[torch.Tensor]:
        """Per sample, [n_i] bool: finite entries of `key` (all True when the batch lacks it)."""
        if key not in self.present:
            return [torch.ones(n, dtype=torch.bool, device=self.device) for n in self.sizes]
        return [torch.isfinite(torch.as_tensor(x)).to(self.device) for x in self.batch[key]]

    def first_nonfinite(self) -> str:
        """The strict policy's message for the first non-finite entry (keys in check order)."""
        for key in self.present:
            for i, (x, ok) in enumerate(zip(self.batch[key], self._finite(key))):
                if not ok.all():
                    k = int((~ok).nonzero()[0])
                    token = self.positions[i][k]
                    return f"{key} is {float(x[k])} at sample {i}, response token {token} (nan_policy=strict)"
        raise AssertionError("no non-finite entry")

    def input_finite(self) -> torch.Tensor:
        """[N] bool: tokens whose every read input is finite (advantages included, token by token)."""
        per_key = [torch.cat(self._finite(k)) for k in self.keys]
        return torch.stack(per_key).all(dim=0) if per_key else torch.ones(0, dtype=torch.bool, device=self.device)

    def cleaned(self) -> dict:
        """A shallow copy of the batch: non-finite entries 0, their tokens (or samples) out of loss_masks.

        Selections, never branches: a finite entry and the mask of a finite token are the same bits after.
        """
        out = dict(self.batch)
        for key in self.present:
            out[key] = [torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) for x in self.batch[key]]
        token_ok = [self._finite(k) for k in self.keys if k != "advantages"]
        per_sample = zip(self.batch["loss_masks"], self._finite("advantages"), self.positions)
        masks = []
        for i, (mask, advantage_ok, pos) in enumerate(per_sample):
            mask = torch.as_tensor(mask)
            ok = torch.stack([finite[i] for finite in token_ok]).all(dim=0) if token_ok else None
            whole = advantage_ok.all().to(mask.device).expand(mask.shape).clone()  # [T] the sample stays
            at = 0
            for start, stop in _runs(pos) if ok is not None else []:  # slices: no index tensor to copy over
                whole[start:stop] &= ok[at : at + stop - start].to(mask.device)
                at += stop - start
            masks.append(torch.where(whole, mask, torch.zeros((), dtype=mask.dtype, device=mask.device)))
        out["loss_masks"] = masks
        return out

    def keep_local(self, loss_masks) -> torch.Tensor:
        """[N] bool: this rank's tokens whose mask (in `loss_masks`) is non-zero, in the rank's order."""
        return local_entries(loss_masks, self.positions).to(self.device) != 0

    def counters(self, keep: torch.Tensor, exp_overflow: torch.Tensor) -> dict:
        """nan_guard/* metrics (counts in this micro-batch, 0-dim float32).

        <key>: non-finite entries of that input (tokens); advantages: samples with a non-finite
        advantage; exp_overflow: tokens where a log-ratio exceeded 88.72 (fp32 exp would give inf),
        prevented by the clamp; dropped_tokens: tokens with loss_mask 1 that the guards removed.
        """
        out = {}
        for key in self.keys:
            if key != "advantages":
                out[f"nan_guard/{key}"] = (~torch.cat(self._finite(key))).sum().float()
        samples = [~f.all() for f in self._finite("advantages")]
        out["nan_guard/advantages"] = (
            torch.stack(samples).sum().float() if samples else torch.zeros((), device=self.device)
        )
        out["nan_guard/exp_overflow"] = exp_overflow
        trained = local_entries(self.batch["loss_masks"], self.positions).to(self.device) != 0
        out["nan_guard/dropped_tokens"] = (trained & ~keep).sum().float()
        return out


def _cat(parts) -> torch.Tensor:
    return torch.cat([torch.as_tensor(x).reshape(-1) for x in parts])


def local_entries(masks, positions: list[list[int]]) -> torch.Tensor:
    """This rank's entries of whole-response masks, samples concatenated: [N] with the masks' dtype.

    Cut with slices (a CP rank holds runs of consecutive positions), so no index tensor is copied to the
    device and nothing waits for it.
    """
    parts = [torch.as_tensor(m)[start:stop] for m, pos in zip(masks, positions) for start, stop in _runs(pos)]
    return torch.cat(parts) if parts else torch.as_tensor(masks[0])[:0]


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """[start, stop) of each run of consecutive positions, in order: [3, 4, 5, 9] -> [(3, 6), (9, 10)]."""
    runs = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


class _Overflow:
    """Which of this rank's N tokens had a log-ratio above FP32_EXP_MAX in any patched exp, [N] bool."""

    def __init__(self, n: int, device):
        self.mask = torch.zeros(n, dtype=torch.bool, device=device)
        self.other = torch.zeros((), device=device)  # overflows in tensors not shaped like the tokens

    def note(self, exponent: torch.Tensor) -> None:
        over = exponent.detach() > FP32_EXP_MAX
        if over.shape == self.mask.shape:
            self.mask |= over.to(self.mask.device)
        else:
            self.other += over.sum().to(self.other.device)

    def count(self, counted: torch.Tensor) -> torch.Tensor:
        """Overflowed tokens among `counted` ([N] bool), plus any other overflow, as 0-dim float32."""
        return (self.mask & counted).sum().float() + self.other


def _bounded(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _clamped(helper, how: str, overflow: _Overflow):
    """`helper` with its log-ratio clamped before it exponentiates it (`how`: a facts.releases.EXP_* kind)."""
    if how == EXP_SECOND_MINUS_FIRST:

        def wrapped(a, b, *args, **kwargs):
            # it computes exp(b - a): move a to b + clamp(a - b) where |a - b| exceeds the bound
            overflow.note(b - a)
            far = (a.detach() - b).abs() > LOG_RATIO_BOUND
            return helper(torch.where(far, b + _bounded(a - b), a), b, *args, **kwargs)

    else:
        sign = -1 if how == EXP_NEG_FIRST else 1

        def wrapped(x, *args, **kwargs):
            overflow.note(sign * x)
            return helper(_bounded(x), *args, **kwargs)

    return wrapped


class _TorchWithClampedExp:
    """Stands in for a loss module's `torch` global: `exp` clamps its argument first, the rest is torch."""

    def __init__(self, overflow: _Overflow):
        self._overflow = overflow

    def __getattr__(self, name):
        return getattr(torch, name)

    def exp(self, x, *args, **kwargs):
        self._overflow.note(x)
        return torch.exp(_bounded(x), *args, **kwargs)


@contextlib.contextmanager
def _patched(target: Target, overflow: _Overflow):
    """Replace the target module's exp-bearing helpers (and inline torch.exp) while the call runs."""
    module, saved = target.module, []
    try:
        for name, how in target.release.clamps.items():
            saved.append((name, getattr(module, name)))
            setattr(module, name, _clamped(getattr(module, name), how, overflow))
        if target.release.inline_exp:
            saved.append(("torch", module.torch))
            module.torch = _TorchWithClampedExp(overflow)
        yield
    finally:
        for name, value in reversed(saved):
            setattr(module, name, value)
