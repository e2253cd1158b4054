"""A dump's headroom, with numpy: how close its log-ratios come to fp32's exp overflow (88.72).

The plugin measures the same metrics inside the loss with torch (`nanscope.loss.headroom`, the formulas'
one definition); scan reads dumps without torch, so the formulas it needs are restated here with numpy,
each under the torch function's name and checked against it in tests/dumps/test_headroom.py:

    kl_log_ratio(logp, ref)        ref - logp                 fp32
    tis_log_ratio(old, rollout)    old - rollout              fp32 (rollout as the release trains with it)
    train_rollout_gap(logp, r)     |logp - r|                 fp32
    maximum(x)                     the largest entry; NaN if any entry is NaN, -inf for none
    quantile(x, q)                 linear interpolation (torch.quantile's); NaN if any is NaN, -inf for none
    clamped(ratios)                tokens where any log-ratio lies beyond the guard's ±LOG_RATIO_BOUND

What each dump kind gives (`Headroom.add`):

    train dump    log_probs (old, from the log-prob pass), ref_log_probs, rollout_log_probs. At the rollout's
                  first training step the policy's logp is log_probs, so KL (ref - log_probs), TIS
                  (log_probs - rollout) and the gap |log_probs - rollout| (trained tokens, loss_mask 1) are
                  exact there; the PPO log-ratio is 0 at that step and bounded by -log_probs after it (logp <= 0,
                  as scan's ratio-margin check reads it): `max_ppo_log_ratio` is that bound.
    rollout dump  only rollout_log_probs: max of -rollout_log_probs bounds TIS's old - rollout (old <= 0), and
                  KL's ref - logp and PPO's logp - old where the trainer's log-probs match the engine's (as
                  scan's kl-margin check reads it): `rollout_log_ratio_bound`.

Every token counts (masked ones too: slime v0.1.0 computes exp on them), except for the gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from nanscope.dumps.sample_checks import SampleView
from nanscope.facts.numerics import LOG_RATIO_BOUND

# What a dump gives, by kind: the metrics `DumpHeadroom.values` can hold.
TRAIN_MAXIMA = ("max_kl_log_ratio", "max_ppo_log_ratio", "max_tis_log_ratio", "train_rollout_gap_max")
ROLLOUT_MAXIMA = ("rollout_log_ratio_bound",)
P99 = 0.99


def kl_log_ratio(logp: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """[N] float32: what k3 / low_var_kl exponentiate, ref - logp (`nanscope.loss.headroom.kl_log_ratio`)."""
    return ref.astype(np.float32, copy=False) - logp.astype(np.float32, copy=False)


def tis_log_ratio(old: np.ndarray, rollout: np.ndarray) -> np.ndarray:
    """[N] float32: what TIS exponentiates, old - rollout (`nanscope.loss.headroom.tis_log_ratio`)."""
    return old.astype(np.float32, copy=False) - rollout.astype(np.float32, copy=False)


def train_rollout_gap(logp: np.ndarray, rollout: np.ndarray) -> np.ndarray:
    """[N] float32: |logp - rollout| (`nanscope.loss.headroom.train_rollout_gap`)."""
    return np.abs(logp.astype(np.float32, copy=False) - rollout.astype(np.float32, copy=False))


def maximum(x: np.ndarray) -> tuple[float, int]:
    """(the largest entry, its index) of `x` [N] (`nanscope.loss.headroom.maximum`'s value): NaN at the first
    NaN if there is one, (-inf, -1) for no entry."""
    if x.size == 0:
        return -math.inf, -1
    nan = np.isnan(x)
    at = int(nan.argmax()) if nan.any() else int(x.argmax())
    return float(x[at]), at


def quantile(x: np.ndarray, q: float) -> float:
    """The q-quantile of `x` [N] by linear interpolation (`nanscope.loss.headroom.quantile`): -inf for no entry,
    NaN if any entry is NaN.

    torch.quantile's arithmetic, in fp32: the rank q * (N - 1), the entries below and above it, and torch's
    lerp between them, fused as its vectorised CPU kernel does (fmadd; np.quantile's fp64 weights differ in
    the last bit). The fused multiply-add is evaluated in fp64; torch without FMA (or on another device)
    may round once more, so the two agree to one fp32 ulp.
    """
    if x.size == 0:
        return -math.inf
    ordered = np.sort(x.astype(np.float32, copy=False))
    if np.isnan(ordered[-1]):  # numpy sorts NaN last
        return math.nan
    f32 = np.float32
    rank = f32(q) * f32(x.size - 1)
    start, end = ordered[int(rank)], ordered[int(np.ceil(rank))]
    weight = rank - f32(int(rank))
    small = abs(weight) < 0.5
    coeff, base = (weight, start) if small else (weight - f32(1.0), end)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in torch
        diff = end - start
        if not (np.isfinite(diff) and np.isfinite(base)):
            return float(coeff * diff + base)
        return float(f32(float(coeff) * float(diff) + float(base)))


def clamped(log_ratios: list[np.ndarray]) -> int:
    """Tokens where any of the log-ratios [N] lies beyond ±LOG_RATIO_BOUND; NaN is not (`...headroom.clamped`)."""
    if not log_ratios or log_ratios[0].size == 0:
        return 0
    with np.errstate(invalid="ignore"):
        return int(np.any([np.abs(r) > LOG_RATIO_BOUND for r in log_ratios], axis=0).sum())


def ppo_log_ratio_bound(old: np.ndarray) -> np.ndarray:
    """[N] float32: -old, which logp - old cannot exceed (logp <= 0). A bound, not a torch formula's equivalent."""
    return -old.astype(np.float32, copy=False)


def later(best: float, value: float) -> bool:
    """Whether `value` replaces the running maximum `best`: a NaN wins (the first one stays), then a larger one."""
    if math.isnan(best):
        return False
    return math.isnan(value) or value > best


@dataclass
class DumpHeadroom:
    """One dump's headroom: small, sent back from a scan's worker.

    Attributes:
        kind: "train" or "rollout".
        values: metric -> its maximum over the dump (NaN if a NaN reached it); a metric the dump cannot give
            (a missing field: only the last pipeline stage has log_probs) is absent.
        samples: metric -> the sample (0-based in the file) holding the maximum.
        gap_sum, gap_count: the sum of |log_probs - rollout_log_probs| over trained tokens, and their number.
        gap_p99: their 99th percentile (None without any).
        clamped_tokens: tokens with a KL or TIS log-ratio beyond ±20 (None if neither could be computed).
    """

    kind: str
    values: dict[str, float] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    gap_sum: float = 0.0
    gap_count: int = 0
    gap_p99: float | None = None
    clamped_tokens: int | None = None


class Headroom:
    """Accumulates a dump's headroom over its samples (`add` each one whose lengths agree), then `result()`."""

    def __init__(self, kind: str):
        self.out = DumpHeadroom(kind)
        self.gaps: list[np.ndarray] = []

    def _max(self, metric: str, x: np.ndarray, sample: int) -> None:
        value, at = maximum(x)
        if at < 0:
            return
        if metric not in self.out.values or later(self.out.values[metric], value):
            self.out.values[metric], self.out.samples[metric] = value, sample

    def add(self, view: SampleView) -> None:
        """One sample's tokens (the view's arrays: rollout log-probs in the dtype the release trains with)."""
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in torch
            self._add(view)

    def _add(self, view: SampleView) -> None:
        sample, present = view.data.sample, view.present
        if view.dump.kind != "train":
            if "rollout_log_probs" in present:
                self._max("rollout_log_ratio_bound", -view.rollout_logp, sample)
            return
        if "log_probs" not in present:
            return
        ratios = []
        self._max("max_ppo_log_ratio", ppo_log_ratio_bound(view.logp), sample)
        if "ref_log_probs" in present:
            ratios.append(kl_log_ratio(view.logp, view.ref_logp))
            self._max("max_kl_log_ratio", ratios[-1], sample)
        if "rollout_log_probs" in present:
            ratios.append(tis_log_ratio(view.logp, view.rollout_logp))
            self._max("max_tis_log_ratio", ratios[-1], sample)
            gap = train_rollout_gap(view.logp, view.rollout_logp)[~view.masked]
            self._max("train_rollout_gap_max", gap, sample)
            self.gaps.append(gap)
        if ratios:
            self.out.clamped_tokens = (self.out.clamped_tokens or 0) + clamped(ratios)

    def result(self) -> DumpHeadroom:
        """The dump's headroom (call once, after the last sample)."""
        if self.gaps:
            gaps = np.concatenate(self.gaps)
            self.out.gap_sum, self.out.gap_count = float(gaps.sum(dtype=np.float64)), int(gaps.size)
            self.out.gap_p99 = quantile(gaps, P99) if gaps.size else None
        return self.out
