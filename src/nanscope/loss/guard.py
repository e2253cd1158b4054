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

The inputs' work is batched over the micro-batch: each per-token key is concatenated once ([N], this rank's N
tokens), the loss masks once ([R], the samples' whole responses), and the per-sample structure (which sample a
token belongs to, where this rank's tokens sit in the whole responses) reaches the device as one index tensor
(`devices.to_device`, a pinned non-blocking copy): a few dozen device ops a micro-batch whatever its number of
samples, and no host read (the `meta` device runs it: tests/loss/test_devices.py).

Counters (`COUNTERS`, a [6] float32 tensor on the logits' device, counts in this micro-batch):

    log_probs, ref_log_probs, rollout_log_probs   non-finite entries of that input (tokens; 0 if not read)
    advantages       samples with a non-finite advantage (under CP counted on the rank holding the sample's last
                     response token, so that the sum over the CP ranks counts each sample once)
    exp_overflow     tokens where a log-ratio exceeded 88.72 (fp32 exp would give inf), prevented by the clamp
    dropped_tokens   tokens with loss_mask 1 that the guards removed

`guarded` returns them as that tensor (the plugin's step adds it up and logs it once per step through its vote:
`nanscope.slime_plugin.step_vote.Counters`); `call` adds them to the metrics as `nan_guard/<name>` 0-dim tensors
(the keys the release reads, as before), which slime's metric packing reads to the host one by one.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools

import torch

from nanscope.facts.numerics import FP32_EXP_MAX, LOG_RATIO_BOUND
from nanscope.facts.releases import EXP_NEG_FIRST, EXP_SECOND_MINUS_FIRST
from nanscope.loss import devices, layout
from nanscope.loss.microbatch import Parallel
from nanscope.loss.target import Target

NAN_POLICIES = ("drop", "strict")
COUNTERS = ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "exp_overflow", "dropped_tokens")
METRICS = tuple(f"nan_guard/{name}" for name in COUNTERS)  # their names as metrics (the plugin's: nanscope/<name>)


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
        (loss, metrics) with nan_guard/* counters added (`counter_metrics`).
    """
    loss, metrics, counts = guarded(
        target, args, batch, logits, sum_of_sample_mean, nan_policy=nan_policy, parallel=parallel
    )
    metrics.update(counter_metrics(counts, target.release.reads(args)))
    return loss, metrics


def guarded(target: Target, args, batch: dict, logits, sum_of_sample_mean, *, nan_policy="drop", parallel=None):
    """`call` without touching the metrics: (loss, the release's metrics, counts [len(COUNTERS)] float32)."""
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy {nan_policy!r}: expected one of {', '.join(NAN_POLICIES)}")
    kwargs = {}
    if target.slicer is None:
        kwargs["parallel"] = parallel = parallel or Parallel.from_megatron()
    runs = response_runs(target, args, batch, parallel)
    guard = _Inputs(batch, target.release.reads(args), runs, logits.device)
    if nan_policy == "strict" and guard.any_nonfinite():
        raise NonFiniteInputError(guard.first_nonfinite())
    clean, keep = guard.cleaned()  # keep: [N] bool, this rank's tokens that stay in the loss

    def select(x):
        return sum_of_sample_mean(torch.where(keep, x, 0.0))

    overflow = _Overflow(keep.numel(), logits.device)
    with _patched(target, overflow):
        loss, metrics = target.entry(args, clean, logits, select, **kwargs)
    return loss, metrics, guard.counts(keep, overflow)


def counter_metrics(counts: torch.Tensor, keys: tuple[str, ...]) -> dict:
    """`nan_guard/<name>` 0-dim views of `counts`: the inputs in `keys` (the release reads them), then advantages,
    exp_overflow and dropped_tokens (the metrics' order since the plugin's first release)."""
    names = [k for k in keys if k != "advantages"] + ["advantages", "exp_overflow", "dropped_tokens"]
    return {f"nan_guard/{name}": counts[COUNTERS.index(name)] for name in names}


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


def response_runs(target: Target, args, batch: dict, parallel=None) -> list[list[tuple[int, int]]]:
    """`response_positions` as runs: per sample, [start, stop) of each run of consecutive response positions this
    rank holds, in its order (a whole response is one run; a zigzag CP rank holds two)."""
    if target.slicer is None:
        parallel = parallel or Parallel.from_megatron()
        return [
            [
                (s.response_start, s.response_start + s.length)
                for s in layout.segments(t, r, parallel.cp_rank, parallel.cp_size)
            ]
            for t, r in zip(batch["total_lengths"], batch["response_lengths"])
        ]
    out = []
    for positions, r in zip(response_positions(target, args, batch, parallel), batch["response_lengths"]):
        whole = len(positions) == r and positions == list(range(r))  # one CP rank: no Python walk over the tokens
        out.append([(0, r)] if whole and r else _runs(positions))
    return out


class _Inputs:
    """The per-token inputs the release reads, their non-finite entries, and the batch without them. Nothing here
    waits for the device but `any_nonfinite` (strict's check) and `first_nonfinite` (its message).

    Per key, the samples' entries concatenated ([N] on the device) and which are finite; the loss masks
    concatenated ([R]); `_Places` for where this rank's tokens sit among them.
    """

    def __init__(self, batch: dict, keys: tuple[str, ...], runs: list[list[tuple[int, int]]], device):
        self.batch, self.keys, self.device = batch, keys, device
        self.present = [k for k in keys if batch.get(k)]
        self.places = _Places(runs, [torch.as_tensor(m).numel() for m in batch["loss_masks"]], device)
        self.values = {k: _cat(batch[k], device) for k in self.present}  # [N] each, the input as it came
        self.finite = {k: torch.isfinite(v) for k, v in self.values.items()}  # [N] bool each
        masks = [torch.as_tensor(m) for m in batch["loss_masks"]]
        self.masks = devices.to_device(torch.cat(masks), device) if masks else torch.zeros(0, device=device)  # [R]

    def any_nonfinite(self) -> bool:
        """Some read input is non-finite (one host sync: nan_policy "strict" only)."""
        flags = [f.all() for f in self.finite.values()]
        return not bool(torch.stack(flags).all()) if flags else False

    def first_nonfinite(self) -> str:
        """The strict policy's message for the first non-finite entry (keys in check order)."""
        for key in self.present:
            bad = ~self.finite[key]
            if bool(bad.any()):
                at = int(bad.nonzero()[0])
                sample, local = self.places.sample_and_local(at)
                token = self.places.position(sample, local)
                value = float(self.values[key][at])
                return f"{key} is {value} at sample {sample}, response token {token} (nan_policy=strict)"
        raise AssertionError("no non-finite entry")

    def _drops(self) -> torch.Tensor:
        """[R] bool: whole-response tokens the guards take out of the loss (their sample's advantage or their own
        input is non-finite)."""
        places = self.places
        drop = torch.zeros(places.whole_total, dtype=torch.bool, device=self.device)
        if "advantages" in self.present:
            drop = places.to_whole_by_sample(places.any_per_sample(~self.finite["advantages"]))
        token = [~self.finite[k] for k in self.present if k != "advantages"]
        if token:
            drop = drop | places.to_whole(torch.stack(token).any(dim=0))
        return drop

    def cleaned(self) -> tuple[dict, torch.Tensor]:
        """(a shallow copy of the batch: non-finite entries 0, their tokens (or samples) out of loss_masks; [N] bool,
        this rank's tokens whose cleaned mask is non-zero). Selections, never branches: a finite entry and the mask
        of a finite token are the same bits after."""
        out = dict(self.batch)
        sizes = self.places.local
        for key in self.present:
            out[key] = list(torch.nan_to_num(self.values[key], nan=0.0, posinf=0.0, neginf=0.0).split(sizes))
        masks = torch.where(self._drops(), torch.zeros((), dtype=self.masks.dtype, device=self.device), self.masks)
        out["loss_masks"] = list(masks.split(self.places.whole))
        return out, self.places.to_local(masks) != 0

    def counts(self, keep: torch.Tensor, overflow: _Overflow) -> torch.Tensor:
        """The COUNTERS of this micro-batch (see the module docstring): [len(COUNTERS)] float32 on the device."""
        zero = devices.full(0.0, self.device)
        by_name = {k: (~self.finite[k]).sum().float() for k in self.present if k != "advantages"}
        if "advantages" in self.present:
            bad = self.places.any_per_sample(~self.finite["advantages"])
            by_name["advantages"] = (bad & self.places.owns_last).sum().float()
        finite = [self.finite[k] for k in self.present]
        counted = torch.stack(finite).all(dim=0) if finite else torch.ones_like(keep)
        by_name["exp_overflow"] = overflow.count(counted)
        trained = self.places.to_local(self.masks) != 0
        by_name["dropped_tokens"] = (trained & ~keep).sum().float()
        return torch.stack([by_name.get(name, zero) for name in COUNTERS])


class _Places:
    """Where this rank's N tokens sit: sample i holds `local[i]` of them (its runs of response positions) out of its
    whole response's `whole[i]`; samples concatenated in order, both ways.

    The per-token indices are built on the host from the runs (lengths only, no data) and reach the device in one
    copy; with one CP rank the local tokens are the whole responses and no index is needed for them.
    """

    def __init__(self, runs: list[list[tuple[int, int]]], whole: list[int], device):
        self.runs, self.whole, self.device = runs, whole, device
        self.local = [sum(b - a for a, b in r) for r in runs]
        self.whole_total = sum(whole)
        self.identity = all(r == [(0, w)] or (not r and not w) for r, w in zip(runs, whole))
        starts = list(itertools.accumulate([0] + whole[:-1]))
        samples = torch.arange(len(whole))
        parts = [torch.repeat_interleave(samples, torch.tensor(self.local, dtype=torch.long))]  # sample of local token
        parts.append(torch.repeat_interleave(samples, torch.tensor(whole, dtype=torch.long)))  # of whole token
        owns = [any(a <= w - 1 < b for a, b in r) for r, w in zip(runs, whole)]  # holds the response's last token
        parts.append(torch.tensor(owns, dtype=torch.long))
        if not self.identity:  # each local token's place among the whole responses
            parts.append(
                torch.cat([torch.arange(s + a, s + b) for r, s in zip(runs, starts) for a, b in r] or [samples[:0]])
            )
        sizes = [p.numel() for p in parts]
        on_device = devices.to_device(torch.cat(parts), device).split(sizes)
        self.sample_of_local, self.sample_of_whole = on_device[0], on_device[1]
        self.owns_last = on_device[2] != 0
        self.whole_index = on_device[3] if not self.identity else None
        self._starts = list(itertools.accumulate([0] + self.local))

    def any_per_sample(self, flags: torch.Tensor) -> torch.Tensor:
        """[S] bool: some of the sample's local tokens is set in `flags` [N] bool."""
        hits = torch.zeros(len(self.whole), device=self.device).index_add_(0, self.sample_of_local, flags.float())
        return hits > 0

    def to_whole_by_sample(self, per_sample: torch.Tensor) -> torch.Tensor:
        """[R]: each whole-response token takes its sample's entry of `per_sample` [S]."""
        return per_sample.index_select(0, self.sample_of_whole)

    def to_whole(self, local: torch.Tensor) -> torch.Tensor:
        """[R] bool: `local` [N] bool at this rank's tokens, False elsewhere."""
        if self.identity:
            return local
        return torch.zeros(self.whole_total, dtype=torch.bool, device=self.device).index_put((self.whole_index,), local)

    def to_local(self, whole: torch.Tensor) -> torch.Tensor:
        """[N]: this rank's entries of `whole` [R], in its order."""
        return whole if self.identity else whole.index_select(0, self.whole_index)

    def sample_and_local(self, at: int) -> tuple[int, int]:
        """(sample, index among its local tokens) of local token `at` (host arithmetic)."""
        sample = bisect.bisect_right(self._starts, at) - 1
        while self.local[sample] == 0:  # an empty sample shares its start with the next
            sample += 1
        return sample, at - self._starts[sample]

    def position(self, sample: int, local: int) -> int:
        """The response position of the sample's `local`-th token on this rank."""
        for a, b in self.runs[sample]:
            if local < b - a:
                return a + local
            local -= b - a
        raise AssertionError("past the sample's tokens")


def _cat(parts, device) -> torch.Tensor:
    """The samples' entries of one per-token key, concatenated ([N]) on `device` (one op when they are there)."""
    return devices.to_device(torch.cat([torch.as_tensor(x).reshape(-1) for x in parts]), device)


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
