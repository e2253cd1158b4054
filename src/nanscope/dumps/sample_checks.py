"""The per-sample checks: each reads one sample (`SampleView`) and records what would make slime's loss
non-finite in the scan's `Collector`. Which run, and in what order, is the check table, `nanscope.dumps.checks`.

The per-token checks are vectorised over the sample's entries (numpy, fp32 as slime's loss computes).
Rollout log-probs are checked in the dtype the format's release trains with them (bf16 in v0.1.0, fp32
from v0.2.4: `bf16`).
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from nanscope.causes import catalogue
from nanscope.dumps.collector import Collector
from nanscope.dumps.dump import Dump, SampleData
from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.verdict import NAN_LOGPROB
from nanscope.facts.keys import DUMP_PER_TOKEN
from nanscope.facts.numerics import FP32_EXP_MAX

# A trained token's rollout log-prob normally sits within a few hundredths of a nat of the log-prob
# pass's (SGLang vs megatron numerics); a median gap of a whole nat means they describe other tokens.
SHIFT_MEDIAN_NATS = 1.0

# Per-sample fields a check can need; `present` sets hold these names.
FIELDS = ("reward",) + DUMP_PER_TOKEN


class SampleView:
    """What the per-sample checks read: the sample, the dump it is from, the flags, the collector, and the
    derived arrays several checks share (each computed once, when first read)."""

    def __init__(self, data: SampleData, dump: Dump, flags: ScanFlags, collector: Collector):
        self.data, self.dump, self.flags, self.collector = data, dump, flags, collector
        self.present = {k for k in FIELDS if getattr(data, k) is not None}

    @cached_property
    def masked(self) -> np.ndarray:
        """bool [local]: loss_mask 0 at each per-token entry."""
        positions = self.data.positions
        return (self.data.loss_mask == 0) if positions is None else (self.data.loss_mask[positions] == 0)

    @cached_property
    def rollout_logp(self) -> np.ndarray:
        """float32 [local]: rollout_log_probs as the format's release trains with them (bf16 or fp32)."""
        stored = self.data.rollout_log_probs
        if self.dump.format.rollout_logprob_dtype == "bfloat16":
            return bf16(stored)
        with np.errstate(over="ignore"):  # float64 beyond float32's range -> inf, as torch's cast
            return np.asarray(stored, dtype=np.float32)

    @cached_property
    def logp(self) -> np.ndarray:
        """float32 [local]: log_probs, the old policy's."""
        return self.data.log_probs.astype(np.float32, copy=False)

    @cached_property
    def ref_logp(self) -> np.ndarray:
        """float32 [local]: ref_log_probs."""
        return self.data.ref_log_probs.astype(np.float32, copy=False)

    def nonfinite(
        self, kind: str, x: np.ndarray, shown: np.ndarray, nan_mechanism: str | None, inf_mechanism: str | None = None
    ) -> None:
        """Findings where x is NaN (nan_mechanism) or +-inf (inf_mechanism); `shown` gives reported values."""
        bad = ~np.isfinite(x)
        if not bad.any():
            return
        nan = np.isnan(x)
        self.collector.tokens(kind, self.data, nan, shown, self.masked, mechanism=nan_mechanism)
        self.collector.tokens(kind, self.data, bad & ~nan, shown, self.masked, mechanism=inf_mechanism)

    def margin(self, kind: str, x: np.ndarray, mechanism: str | None, certain: bool) -> None:
        """Findings where the fp32 log-ratio (or its bound) x exceeds exp's limit; x goes into a histogram."""
        if self.flags.histograms:
            self.collector.histogram(kind, x, self.masked)
        self.collector.tokens(kind, self.data, x > FP32_EXP_MAX, x, self.masked, mechanism=mechanism, certain=certain)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 and widen back to fp32, as slime v0.1.0 stores rollout_log_probs for training
    (slime/backends/utils/data.py:148; float32 from v0.2.4: `nanscope.facts.releases`).

    Same arithmetic as torch's float -> bfloat16 (c10 round_to_nearest_even): via float32, then round
    the low 16 bits to nearest-even; NaN stays NaN, values past bf16's max become inf. numpy bit
    arithmetic, ~10x faster than a torch round trip.
    """
    with np.errstate(over="ignore"):  # float64 beyond float32's range -> inf, as in torch
        as_fp32 = np.asarray(x, dtype=np.float32)
    bits = as_fp32.view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = ((bits + rounding) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(as_fp32), as_fp32, rounded)


# ----------------------------------------------------------------------------------------- the checks


def check_lengths(view: SampleView) -> bool:
    """Length mismatches (and an error line each: slime v0.1.0 asserts or mis-slices on them).

    Returns False when lengths disagree: per-token positions are then meaningless, the sample's other
    checks do not run.
    """
    data, dump = view.data, view.dump
    lengths, response_length = data.lengths, data.response_length
    bad: list[tuple[str, int, str]] = []
    if response_length > data.tokens_length:
        bad.append(
            (
                "response_length",
                response_length,
                f"response_length {response_length} > len(tokens) {data.tokens_length}",
            )
        )
    if "total_lengths" in lengths and lengths["total_lengths"] != data.tokens_length:
        total = lengths["total_lengths"]
        bad.append(("total_lengths", total, f"total_lengths {total} != len(tokens) {data.tokens_length}"))
    if "loss_mask" in lengths and lengths["loss_mask"] != response_length:
        mask = lengths["loss_mask"]
        bad.append(("loss_mask", mask, f"length {mask} != response_length {response_length}"))
    if not bad:
        expected = response_length if data.positions is None else len(data.positions)
        what = "response_length" if data.positions is None else f"this CP rank's share ({expected})"
        for key in DUMP_PER_TOKEN:
            if key in lengths and lengths[key] != expected:
                hint = ""
                if dump.kind == "train" and dump.cp_size == 1 and lengths[key] < response_length:
                    hint = " (CP-sliced? pass --context-parallel-size and --tensor-model-parallel-size)"
                bad.append((key, lengths[key], f"length {lengths[key]} != {what} {expected}{hint}"))
    for name, value, text in bad:
        view.collector.sample_level("length-mismatch", data.sample, None, value, f"{name}: {text}")
        view.collector.errors.append(f"{dump.path}: {name} of sample {data.sample}: {text}")
    return not bad


def check_zero_loss_mask(view: SampleView) -> None:
    if view.data.response_length > 0 and not view.data.loss_mask.any():
        view.collector.sample_level("zero-loss-mask", view.data.sample, None, 0, "loss_mask sums to 0")


def check_too_long(view: SampleView) -> None:
    limit, n = view.flags.rollout_max_response_len, view.data.response_length
    if limit is not None and n > limit:
        view.collector.sample_level(
            "response-too-long", view.data.sample, None, n, f"response_length {n} > --rollout-max-response-len {limit}"
        )


def check_reward(view: SampleView) -> None:
    if not math.isfinite(view.data.reward):
        view.collector.sample_level("nonfinite-reward", view.data.sample, catalogue.NAN_REWARD.name, view.data.reward)


def check_rollout_logprob(view: SampleView) -> None:
    mechanism = catalogue.NAN_ROLLOUT_LOGPROB.name if view.flags.use_tis else None
    view.nonfinite("nonfinite-rollout-logprob", view.rollout_logp, view.data.rollout_log_probs, mechanism)


def check_log_prob(view: SampleView) -> None:
    view.nonfinite("nonfinite-log-prob", view.logp, view.logp, NAN_LOGPROB)


def check_ref_log_prob(view: SampleView) -> None:
    view.nonfinite("nonfinite-ref-log-prob", view.ref_logp, view.ref_logp, NAN_LOGPROB)


def check_advantage(view: SampleView) -> None:
    advantages = view.data.advantages
    view.nonfinite("nonfinite-advantage", advantages, advantages, catalogue.NAN_REWARD.name, catalogue.NAN_REWARD.name)


def check_kl(view: SampleView) -> None:
    if view.dump.kind == "train":
        view.margin("kl-margin", view.ref_logp - view.logp, catalogue.KL_EXP_OVERFLOW.name, True)
    else:
        view.margin("kl-margin", -view.rollout_logp, catalogue.KL_EXP_OVERFLOW.name, False)


def check_ratio(view: SampleView) -> None:
    old_logp = view.logp if view.dump.kind == "train" else view.rollout_logp
    view.margin("ratio-margin", -old_logp, catalogue.RATIO_EXP_OVERFLOW.name, False)


def check_tis(view: SampleView) -> None:
    view.margin("tis-margin", view.logp - view.rollout_logp, None, True)


def check_mismatch(view: SampleView) -> None:
    trained = ~view.masked & np.isfinite(view.logp) & np.isfinite(view.rollout_logp)
    if not trained.any():
        return
    gap = float(np.median(np.abs(view.logp[trained] - view.rollout_logp[trained])))
    if gap > SHIFT_MEDIAN_NATS:
        view.collector.sample_level(
            "logprob-mismatch",
            view.data.sample,
            catalogue.ROLLOUT_LOGPROB_SHIFT.name,
            gap,
            f"median |log_probs - rollout_log_probs| = {gap:.2f} nats over {int(trained.sum())} "
            "trained tokens: misaligned (shifted by a token?) or from other weights",
        )
