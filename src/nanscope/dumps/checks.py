"""Vectorised hazard checks over a slime dump, one sample at a time.

Each check looks at what slime's loss would compute from a sample and reports the inputs that make it
non-finite (the "mechanism", named as in `nanscope.hazards`). The checks are the same for every dump
format (`nanscope.dumps.formats`); the format decides the dtype the rollout log-probs are checked in
(bf16 as v0.1.0's trainer holds them, fp32 from v0.2.4) and the release the verdict names.

    kl-exp-overflow      ref_logp - logp > 88.72: low_var_kl/k3 exp overflows; NaN gradient even at
                         kl-loss-coef 0 and on masked tokens (masking is a multiplication after the exp).
    ratio-exp-overflow   logp - old_logp > 88.72: the PPO ratio exp overflows; NaN gradient.
    nan-rollout-logprob  a NaN rollout log-prob reaches TIS (exp, clamp keep the NaN): NaN loss.
                         (+-inf is clamped to tis_clip / tis_clip_low: finite loss, inf `tis` metric.)
    nan-reward           a non-finite reward, or a group whose normalisation is non-finite (a group of
                         one sample has torch.std = nan): the whole group's advantages are NaN: NaN loss.
    nan-logprob          scan's own (`NAN_LOGPROB`): a NaN old or reference log-prob (train dumps).

One finding names a hazard that leaves the loss finite (`SIGNALS`, kept out of the NaN verdict):

    rollout-logprob-shift  rollout log-probs far from the log-prob pass's on trained tokens (median gap
                         above SHIFT_MEDIAN_NATS, train dumps): misaligned by a token or from other
                         weights; TIS clamps the weight, only the tis metric explodes.

Rollout dumps carry only rollout_log_probs. The log-ratio checks then use bounds: every log-prob is
<= 0, so ref_logp - logp <= -logp and logp - old_logp <= -old_logp, with rollout_log_probs standing in
for logp and old_logp. A bound hit is `certain=False` ("possibly"); dump train data to confirm it.

Each check is one `Check` record in `CHECKS` (report order): its kind, what it looks at, its function,
when it is skipped and its note. Every finding carries `sample` (0-based in the file), `token` (0-based
in the response), `abs_token` (in the whole sequence: prompt_length + token), `masked` (loss_mask 0) and
`value`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from nanscope.causes import catalogue
from nanscope.dumps.config import ScanConfig
from nanscope.dumps.formats import DumpFormat
from nanscope.dumps.io import Dump, SampleData
from nanscope.facts import releases
from nanscope.facts.keys import DUMP_PER_TOKEN
from nanscope.facts.numerics import FP32_EXP_MAX

NAN_LOGPROB = "nan-logprob"
"""A scan-only mechanism, not in the hazard catalogue: a non-finite old or reference log-prob in a train
dump makes the PPO ratio or the KL term NaN, so the loss is NaN."""

# Mechanisms in verdict order.
MECHANISMS = (
    catalogue.KL_EXP_OVERFLOW.name,
    catalogue.RATIO_EXP_OVERFLOW.name,
    catalogue.NAN_ROLLOUT_LOGPROB.name,
    catalogue.NAN_REWARD.name,
    NAN_LOGPROB,
)

# Found and reported, but the loss stays finite: not part of the NaN verdict.
SIGNALS = (catalogue.ROLLOUT_LOGPROB_SHIFT.name,)

# A trained token's rollout log-prob normally sits within a few hundredths of a nat of the log-prob
# pass's (SGLang vs megatron numerics); a median gap of a whole nat means they describe other tokens.
SHIFT_MEDIAN_NATS = 1.0

# Per-sample fields a check can need; `present` sets hold these names.
FIELDS = ("reward",) + DUMP_PER_TOKEN

# Findings listed in all (counts stay exact): a hostile file cannot make the list outgrow memory.
MAX_LISTED = 100_000

# Histogram of per-token log-ratios: unit bins on [LO, HI), plus an underflow and an overflow bin.
HIST_LO, HIST_HI = -40, 120


@dataclass
class Finding:
    """One hazard found in the dump. token/abs_token/masked are None for sample-level findings."""

    kind: str
    mechanism: str | None
    sample: int
    token: int | None
    abs_token: int | None
    masked: bool | None
    value: float | int | None
    certain: bool = True
    detail: str = ""


@dataclass
class CheckSummary:
    """One check's outcome: `count` findings (exact), `listed` of them in ScanResult.hazards."""

    kind: str
    status: str  # "ran" or "skipped"
    count: int = 0
    listed: int = 0
    mechanisms: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Histogram:
    """Counts of one per-token log-ratio: [under, LO..LO+1, ..., HI-1..HI, over]; nan counted apart."""

    label: str
    all: np.ndarray
    masked: np.ndarray
    nan: int = 0

    @staticmethod
    def empty(label: str) -> Histogram:
        n = HIST_HI - HIST_LO + 2
        return Histogram(label, np.zeros(n, np.int64), np.zeros(n, np.int64))


@dataclass
class ScanResult:
    """Everything a renderer needs. per_sample[i, k] counts findings of check KINDS[k] in sample i."""

    path: str
    dump_kind: str
    rollout_id: object
    rank: int | None
    num_samples: int
    response_tokens: int
    config: ScanConfig
    hazards: list[Finding]
    checks: list[CheckSummary]
    per_sample: np.ndarray
    histograms: dict[str, Histogram]
    errors: list[str]
    would_nan: str  # "yes", "possibly" or "no"
    mechanisms: list[str]  # certain ones first, then possible ones
    verdict: str
    format: DumpFormat


# ------------------------------------------------------------------------------------------- collector


class _Collector:
    """Accumulates exact counts, a capped list of findings, per-sample counts and histograms."""

    def __init__(self, cfg: ScanConfig):
        self.cfg = cfg
        self.hazards: list[Finding] = []
        self.counts = dict.fromkeys(KINDS, 0)
        self.listed = dict.fromkeys(KINDS, 0)
        self.mechs: dict[str, dict[str, bool]] = {k: {} for k in KINDS}  # kind -> mechanism -> any certain
        self.rows: dict[int, np.ndarray] = {}  # sample -> counts per kind, for samples with findings only
        self.col = {k: j for j, k in enumerate(KINDS)}
        self.hist: dict[str, Histogram] = {}
        self.errors: list[str] = []

    def _note(self, kind: str, mechanism: str | None, certain: bool, n: int, sample: int) -> None:
        self.counts[kind] += n
        row = self.rows.get(sample)
        if row is None:
            row = self.rows[sample] = np.zeros(len(KINDS), np.int64)
        row[self.col[kind]] += n
        if mechanism is not None:
            m = self.mechs[kind]
            m[mechanism] = m.get(mechanism, False) or certain

    def per_sample(self, num_samples: int) -> np.ndarray:
        """int64 [num_samples, len(KINDS)]: findings per sample and check."""
        out = np.zeros((num_samples, len(KINDS)), np.int64)
        for i, row in self.rows.items():
            out[i] = row
        return out

    def _room(self) -> bool:
        return len(self.hazards) < MAX_LISTED

    def sample_level(
        self, kind: str, sample: int, mechanism: str | None, value, detail: str = "", certain: bool = True
    ) -> None:
        self._note(kind, mechanism, certain, 1, sample)
        if self._room():
            self.listed[kind] += 1
            self.hazards.append(Finding(kind, mechanism, sample, None, None, None, value, certain, detail))

    def tokens(
        self,
        kind: str,
        s: SampleData,
        hit: np.ndarray,
        values: np.ndarray,
        pos: np.ndarray | None,
        masked: np.ndarray,
        mechanism: str | None,
        certain: bool = True,
    ) -> None:
        """Record the local entries where `hit` is True (values/masked are local-indexed like hit)."""
        idx = np.flatnonzero(hit)
        if idx.size == 0:
            return
        self._note(kind, mechanism, certain, int(idx.size), s.sample)
        idx = idx[: min(self.cfg.max_listed, MAX_LISTED - len(self.hazards))]
        self.listed[kind] += int(idx.size)
        tok = idx if pos is None else pos[idx]
        for j, t in zip(idx.tolist(), tok.tolist()):
            self.hazards.append(
                Finding(kind, mechanism, s.sample, t, s.prompt_length + t, bool(masked[j]), float(values[j]), certain)
            )

    def histogram(self, key: str, label: str, x: np.ndarray, masked: np.ndarray) -> None:
        h = self.hist.get(key) or self.hist.setdefault(key, Histogram.empty(label))
        nan = np.isnan(x)
        if nan.any():
            h.nan += int(nan.sum())
            x, masked = x[~nan], masked[~nan]
        # Bin b holds [LO+b-1, LO+b); 0 is underflow (and -inf), the last is overflow (and +inf). Shifted
        # to be >= 0 before the cast, truncation is floor. Even slots count unmasked tokens, odd masked.
        t = np.subtract(x, HIST_LO - 1, dtype=np.float32)
        np.clip(t, 0, h.all.size - 1, out=t)
        b = t.astype(np.int32)
        b *= 2
        b += masked
        both = np.bincount(b, minlength=2 * h.all.size)
        h.all += both[0::2] + both[1::2]
        h.masked += both[1::2]


# ----------------------------------------------------------------------------------- one sample's view


class _Sample:
    """What the per-sample checks read: the sample, the dump it is from, and shared derived arrays."""

    def __init__(self, s: SampleData, dump: Dump, cfg: ScanConfig, col: _Collector):
        self.s, self.dump, self.cfg, self.col = s, dump, cfg, col
        self.present = {k for k in FIELDS if getattr(s, k) is not None}

    @cached_property
    def masked(self) -> np.ndarray:
        """bool [local]: loss_mask 0 at each per-token entry."""
        pos = self.s.positions
        return (self.s.loss_mask == 0) if pos is None else (self.s.loss_mask[pos] == 0)

    @cached_property
    def r(self) -> np.ndarray:
        """float32 [local]: rollout_log_probs as the format's release trains with them (bf16 or fp32)."""
        x = self.s.rollout_log_probs
        if self.dump.format.rollout_logprob_dtype == "bfloat16":
            return _bf16(x)
        with np.errstate(over="ignore"):  # float64 beyond float32's range -> inf, as torch's cast
            return np.asarray(x, dtype=np.float32)

    @cached_property
    def lp(self) -> np.ndarray:
        return self.s.log_probs.astype(np.float32, copy=False)

    @cached_property
    def ref(self) -> np.ndarray:
        return self.s.ref_log_probs.astype(np.float32, copy=False)

    def nonfinite(
        self, kind: str, x: np.ndarray, shown: np.ndarray, nan_mechanism: str | None, inf_mechanism: str | None = None
    ) -> None:
        """Findings where x is NaN (nan_mechanism) or +-inf (inf_mechanism); `shown` gives reported values."""
        bad = ~np.isfinite(x)
        if not bad.any():
            return
        nan = np.isnan(x)
        self.col.tokens(kind, self.s, nan, shown, self.s.positions, self.masked, nan_mechanism)
        self.col.tokens(kind, self.s, bad & ~nan, shown, self.s.positions, self.masked, inf_mechanism)

    def margin(self, kind: str, x: np.ndarray, mechanism: str | None, certain: bool) -> None:
        """Findings where the fp32 log-ratio (or its bound) x exceeds exp's limit; x goes into a histogram."""
        if self.cfg.histograms:
            self.col.histogram(kind, BY_KIND[kind].looks_at, x, self.masked)
        self.col.tokens(kind, self.s, x > FP32_EXP_MAX, x, self.s.positions, self.masked, mechanism, certain)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 and widen back to fp32, as slime v0.1.0 stores rollout_log_probs for training
    (slime/backends/utils/data.py:148; float32 from v0.2.4: `nanscope.facts.releases`).

    Same arithmetic as torch's float -> bfloat16 (c10 round_to_nearest_even): via float32, then round
    the low 16 bits to nearest-even; NaN stays NaN, values past bf16's max become inf. numpy bit
    arithmetic, ~10x faster than a torch round trip.
    """
    with np.errstate(over="ignore"):  # float64 beyond float32's range -> inf, as in torch
        f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    r = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(f), f, r)


# ----------------------------------------------------------------------------------------- the checks


def _lengths(v: _Sample) -> bool:
    """Length mismatches (and an error line each: slime v0.1.0 asserts or mis-slices on them).

    Returns False when lengths disagree: per-token positions are then meaningless, the sample's other
    checks do not run.
    """
    s, dump = v.s, v.dump
    L, R = s.lengths, s.response_length
    bad: list[tuple[str, int, str]] = []
    if R > s.tokens_length:
        bad.append(("response_length", R, f"response_length {R} > len(tokens) {s.tokens_length}"))
    if "total_lengths" in L and L["total_lengths"] != s.tokens_length:
        bad.append(
            (
                "total_lengths",
                L["total_lengths"],
                f"total_lengths {L['total_lengths']} != len(tokens) {s.tokens_length}",
            )
        )
    if "loss_mask" in L and L["loss_mask"] != R:
        bad.append(("loss_mask", L["loss_mask"], f"length {L['loss_mask']} != response_length {R}"))
    if not bad:
        expected = R if s.positions is None else len(s.positions)
        what = "response_length" if s.positions is None else f"this CP rank's share ({expected})"
        for key in DUMP_PER_TOKEN:
            if key in L and L[key] != expected:
                hint = ""
                if dump.kind == "train" and dump.cp_size == 1 and L[key] < R:
                    hint = " (CP-sliced? pass --context-parallel-size and --tensor-model-parallel-size)"
                bad.append((key, L[key], f"length {L[key]} != {what} {expected}{hint}"))
    for name, value, text in bad:
        v.col.sample_level("length-mismatch", s.sample, None, value, f"{name}: {text}")
        v.col.errors.append(f"{dump.path}: {name} of sample {s.sample}: {text}")
    return not bad


def _zero_loss_mask(v: _Sample) -> None:
    if v.s.response_length > 0 and not v.s.loss_mask.any():
        v.col.sample_level("zero-loss-mask", v.s.sample, None, 0, "loss_mask sums to 0")


def _too_long(v: _Sample) -> None:
    limit, n = v.cfg.rollout_max_response_len, v.s.response_length
    if limit is not None and n > limit:
        v.col.sample_level(
            "response-too-long", v.s.sample, None, n, f"response_length {n} > --rollout-max-response-len {limit}"
        )


def _reward(v: _Sample) -> None:
    if not math.isfinite(v.s.reward):
        v.col.sample_level("nonfinite-reward", v.s.sample, catalogue.NAN_REWARD.name, v.s.reward)


def _rollout_logprob(v: _Sample) -> None:
    mechanism = catalogue.NAN_ROLLOUT_LOGPROB.name if v.cfg.use_tis else None
    v.nonfinite("nonfinite-rollout-logprob", v.r, v.s.rollout_log_probs, mechanism)


def _log_prob(v: _Sample) -> None:
    v.nonfinite("nonfinite-log-prob", v.lp, v.lp, NAN_LOGPROB)


def _ref_log_prob(v: _Sample) -> None:
    v.nonfinite("nonfinite-ref-log-prob", v.ref, v.ref, NAN_LOGPROB)


def _advantage(v: _Sample) -> None:
    a = v.s.advantages
    v.nonfinite("nonfinite-advantage", a, a, catalogue.NAN_REWARD.name, catalogue.NAN_REWARD.name)


def _kl(v: _Sample) -> None:
    if v.dump.kind == "train":
        v.margin("kl-margin", v.ref - v.lp, catalogue.KL_EXP_OVERFLOW.name, True)
    else:
        v.margin("kl-margin", -v.r, catalogue.KL_EXP_OVERFLOW.name, False)


def _ratio(v: _Sample) -> None:
    old = v.lp if v.dump.kind == "train" else v.r
    v.margin("ratio-margin", -old, catalogue.RATIO_EXP_OVERFLOW.name, False)


def _tis(v: _Sample) -> None:
    v.margin("tis-margin", v.lp - v.r, None, True)


def _mismatch(v: _Sample) -> None:
    trained = ~v.masked & np.isfinite(v.lp) & np.isfinite(v.r)
    if not trained.any():
        return
    gap = float(np.median(np.abs(v.lp[trained] - v.r[trained])))
    if gap > SHIFT_MEDIAN_NATS:
        v.col.sample_level(
            "logprob-mismatch",
            v.s.sample,
            catalogue.ROLLOUT_LOGPROB_SHIFT.name,
            gap,
            f"median |log_probs - rollout_log_probs| = {gap:.2f} nats over {int(trained.sum())} "
            "trained tokens: misaligned (shifted by a token?) or from other weights",
        )


@dataclass
class _Rollout:
    """What the rollout-level checks read: every sample's reward (nan where a sample has none)."""

    path: str
    rewards: list[float]
    cfg: ScanConfig
    col: _Collector


def _groups(g: _Rollout) -> None:
    """Run slime v0.1.0's group normalisation (post_process_rewards) and flag non-finite outputs."""
    import torch

    from nanscope.loss.formulas import grpo_normalize

    cfg, col, rewards = g.cfg, g.col, g.rewards
    if not rewards:
        return
    n = cfg.n_samples_per_prompt
    if len(rewards) % n:
        col.errors.append(
            f"{g.path}: samples: {len(rewards)} samples do not form groups of --n-samples-per-prompt {n} "
            f"({len(rewards)} % {n} = {len(rewards) % n}): slime v0.1.0's reshape(-1, {n}) fails"
        )
        return
    std = cfg.grpo_std_normalization and cfg.advantage_estimator in ("grpo", "gspo")
    # torch.std of a single element is nan (unbiased): a group of 1 is all-nan by itself.
    with warnings.catch_warnings():  # torch warns on the std of one element; that nan is the point
        warnings.simplefilter("ignore")
        norm = grpo_normalize(torch.tensor(rewards, dtype=torch.float32), n, std).numpy()
    for grp in np.flatnonzero(~np.isfinite(norm.reshape(-1, n)).all(axis=1)).tolist():
        lo, hi = grp * n, (grp + 1) * n
        bad = [i for i in range(lo, hi) if not math.isfinite(rewards[i])]
        if bad:
            why = f"sample {bad[0]}'s reward is {rewards[bad[0]]}"
        elif n == 1 and std:
            why = "group of 1: std of one element is nan"
        else:
            why = "rewards overflow float32"
        for i in range(lo, hi):
            if not math.isfinite(norm[i]):
                col.sample_level("grpo-nonfinite", i, catalogue.NAN_REWARD.name, float(norm[i]), f"group {grp}: {why}")


# ---------------------------------------------------------------------------------------- skip reasons
# Each: (cfg, dump kind, present fields) -> why the check does not run, "" when it runs. Evaluated per
# sample (with that sample's fields) to decide whether to run, and once over the whole dump for the summary.


def _never(cfg: ScanConfig, dump_kind: str, present: set[str]) -> str:
    return ""


def _needs(name: str) -> Callable[[ScanConfig, str, set[str]], str]:
    return lambda cfg, dump_kind, present: "" if name in present else f"no {name} in this dump"


def _skip_groups(cfg: ScanConfig, dump_kind: str, present: set[str]) -> str:
    if dump_kind == "train":
        return "train dump: rewards already normalised"
    if cfg.advantage_estimator not in releases.GROUP_NORMALISED:
        return f"--advantage-estimator {cfg.advantage_estimator} has no group normalisation"
    if not cfg.rewards_normalization:
        return "--disable-rewards-normalization"
    return ""


def _skip_ref(cfg: ScanConfig, dump_kind: str, present: set[str]) -> str:
    if "ref_log_probs" not in present:
        return "no ref_log_probs in this dump"
    return "" if cfg.use_kl_loss else "--no-use-kl-loss: ref_log_probs do not reach the loss"


def _kl_applies(cfg: ScanConfig) -> bool:
    """The KL term is computed (and so can overflow) with --use-kl-loss and an exp-based estimator."""
    return cfg.use_kl_loss and cfg.kl_loss_type in ("low_var_kl", "k3")


def _skip_kl(cfg: ScanConfig, dump_kind: str, present: set[str]) -> str:
    if not _kl_applies(cfg):
        return "KL loss off or --kl-loss-type without exp (kl, k2)"
    if dump_kind == "train" and not {"ref_log_probs", "log_probs"} <= present:
        return "needs log_probs and ref_log_probs (only the last pipeline stage has them)"
    if dump_kind == "rollout" and "rollout_log_probs" not in present:
        return "no rollout_log_probs in this dump"
    return ""


def _skip_ratio(cfg: ScanConfig, dump_kind: str, present: set[str]) -> str:
    if dump_kind == "train" and "log_probs" not in present:
        return "needs log_probs (only the last pipeline stage has them)"
    if dump_kind == "rollout" and "rollout_log_probs" not in present:
        return "no rollout_log_probs in this dump"
    return ""


def _skip_tis(cfg: ScanConfig, dump_kind: str, present: set[str]) -> str:
    if not cfg.use_tis:
        return "--no-use-tis"
    if dump_kind == "rollout":
        return "rollout dump: no old log-probs"
    if not {"log_probs", "rollout_log_probs"} <= present:
        return "needs log_probs and rollout_log_probs"
    return ""


# ----------------------------------------------------------------------------------- the check records


@dataclass(frozen=True)
class Check:
    """One scan check, all of it in one place.

    Attributes:
        kind: its name in reports and JSON.
        looks_at: what it reads, in words (the check table, histogram labels).
        run: per-sample checks take a `_Sample`; a False return (the length gate) stops that sample's
            remaining checks. Rollout-level checks (`per_rollout`) take a `_Rollout` once, after every sample.
        skip: (cfg, dump kind, present fields) -> why it does not run, "" when it runs.
        note: dump kind -> the caveat shown in the summary when it ran.
        per_rollout: runs once over the rollout's rewards instead of per sample.
        gate: runs before the other per-sample checks, whose positions need it to pass.
    """

    kind: str
    looks_at: str
    run: Callable
    skip: Callable[[ScanConfig, str, set[str]], str] = _never
    note: Callable[[str], str] = lambda dump_kind: ""
    per_rollout: bool = False
    gate: bool = False


CHECKS: tuple[Check, ...] = (
    Check(
        "nonfinite-reward",
        "reward (rollout dump: raw, after --reward-key; train dump: the normalised rewards)",
        _reward,
        _needs("reward"),
    ),
    Check(
        "grpo-nonfinite",
        "GRPO group normalisation of the rewards gives a non-finite advantage",
        _groups,
        _skip_groups,
        per_rollout=True,
    ),
    Check(
        "nonfinite-rollout-logprob",
        "rollout_log_probs (in the dtype slime feeds TIS: bf16 in v0.1.0, fp32 from v0.2.4)",
        _rollout_logprob,
        _needs("rollout_log_probs"),
        lambda dump_kind: "nan: NaN loss via TIS; +-inf is clamped",
    ),
    Check("nonfinite-log-prob", "log_probs (old policy, fp32)", _log_prob, _needs("log_probs")),
    Check("nonfinite-ref-log-prob", "ref_log_probs (fp32)", _ref_log_prob, _skip_ref),
    Check("nonfinite-advantage", "advantages", _advantage, _needs("advantages")),
    Check(
        "kl-margin",
        "ref_logp - logp > 88.72 (low_var_kl / k3 exp)",
        _kl,
        _skip_kl,
        lambda dump_kind: (
            "bound -rollout_log_probs (ref_logp <= 0)"
            if dump_kind == "rollout"
            else "logp = log_probs (exact at the first step)"
        ),
    ),
    Check(
        "ratio-margin",
        "logp - old_logp > 88.72 (PPO ratio exp)",
        _ratio,
        _skip_ratio,
        lambda dump_kind: f"bound -{'rollout_log_probs' if dump_kind == 'rollout' else 'log_probs'} (logp <= 0)",
    ),
    Check(
        "tis-margin",
        "old_logp - rollout_logp > 88.72 (TIS exp; clamped, so only the tis metric is inf)",
        _tis,
        _skip_tis,
        lambda dump_kind: "exact; clamped, no NaN (tis metric inf)",
    ),
    Check(
        "logprob-mismatch",
        f"median |log_probs - rollout_log_probs| > {SHIFT_MEDIAN_NATS:g} nat on trained tokens "
        "(misaligned rollout log-probs)",
        _mismatch,
        _skip_tis,
        lambda dump_kind: "loss stays finite; TIS weights and the tis metric are off",
    ),
    Check(
        "length-mismatch",
        "tokens / response_length / loss_mask / per-token lengths disagree (slime asserts)",
        _lengths,
        gate=True,
    ),
    Check(
        "zero-loss-mask",
        "loss_mask all zero (the sample adds nothing, but its tokens still go through exp)",
        _zero_loss_mask,
    ),
    Check("response-too-long", "response_length > --rollout-max-response-len", _too_long),
)
BY_KIND = {c.kind: c for c in CHECKS}
KINDS = tuple(BY_KIND)  # report order; the columns of ScanResult.per_sample
_PER_SAMPLE = tuple(sorted((c for c in CHECKS if not c.per_rollout), key=lambda c: not c.gate))


# ------------------------------------------------------------------------------------------------ scan


def scan(dump: Dump, cfg: ScanConfig, progress: Callable[[int], None] | None = None) -> ScanResult:
    """Run every check over `dump`, streaming its samples.

    Args:
        dump: from `nanscope.dumps.io.load` (consumed).
        cfg: slime flags that decide what is a hazard (the case's: `nanscope.case.scan_config()`).
        progress: called with each sample's response length after it is checked.
    """
    col = _Collector(cfg)
    rewards: list[float] = []
    present: set[str] = set()
    response_tokens = 0
    for s in dump.samples():
        response_tokens += s.response_length
        rewards.append(math.nan if s.reward is None else s.reward)
        v = _Sample(s, dump, cfg, col)
        present |= v.present
        _check_sample(v)
        if progress is not None:
            progress(s.response_length)
    rollout = _Rollout(dump.path, rewards, cfg, col)
    for c in CHECKS:
        if c.per_rollout and not c.skip(cfg, dump.kind, present):
            c.run(rollout)
    checks = [_summary(c, dump.kind, cfg, col, present) for c in CHECKS]
    would, mechs, verdict = _verdict(col, dump.format.release)
    col.hazards.sort(key=lambda h: (h.sample, -1 if h.token is None else h.token, KINDS.index(h.kind)))
    return ScanResult(
        dump.path,
        dump.kind,
        dump.rollout_id,
        dump.rank,
        dump.num_samples,
        response_tokens,
        cfg,
        col.hazards,
        checks,
        col.per_sample(dump.num_samples),
        col.hist,
        col.errors,
        would,
        mechs,
        verdict,
        dump.format,
    )


def _check_sample(v: _Sample) -> None:
    with np.errstate(invalid="ignore", over="ignore"):
        for c in _PER_SAMPLE:
            if c.skip(v.cfg, v.dump.kind, v.present):
                continue
            if c.run(v) is False:
                return


def _summary(c: Check, dump_kind: str, cfg: ScanConfig, col: _Collector, present: set[str]) -> CheckSummary:
    skip = c.skip(cfg, dump_kind, present)
    return CheckSummary(
        c.kind,
        "skipped" if skip else "ran",
        col.counts[c.kind],
        col.listed[c.kind],
        [m for m in MECHANISMS + SIGNALS if m in col.mechs[c.kind]],
        skip or c.note(dump_kind),
    )


def _verdict(col: _Collector, release: str) -> tuple[str, list[str], str]:
    certain, possible = set(), set()
    for kind in KINDS:
        for m, c in col.mechs[kind].items():
            (certain if c else possible).add(m)
    possible -= certain
    yes = [m for m in MECHANISMS if m in certain]
    maybe = [m for m in MECHANISMS if m in possible]
    would, mechanisms, text = _nan_verdict(yes, maybe, f"slime {release}")
    signals = [m for m in SIGNALS if m in certain]
    if signals:
        text += (
            f"; rollout log-probs disagree with the log-prob pass ({', '.join(signals)}): the loss stays "
            "finite, the TIS weights and the tis metric do not"
        )
    return would, mechanisms, text


def _nan_verdict(yes: list[str], maybe: list[str], slime: str) -> tuple[str, list[str], str]:
    if yes:
        text = f"{slime} would produce NaN: yes, via {', '.join(yes)}"
        if maybe:
            text += f"; possibly also via {', '.join(maybe)} (bounds only)"
        return "yes", yes + maybe, text
    if maybe:
        return (
            "possibly",
            maybe,
            f"{slime} would produce NaN: possibly, via {', '.join(maybe)} (bounds only: dump train data to confirm)",
        )
    return "no", [], f"{slime} would produce NaN: no"


def hazard_count(result: ScanResult) -> int:
    """Total findings (exact, including those not listed)."""
    return sum(c.count for c in result.checks)
