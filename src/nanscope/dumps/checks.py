"""Vectorised hazard checks over a slime v0.1.0 dump, one sample at a time.

Each check looks at what slime v0.1.0's loss would compute from a sample and reports the inputs that
make it non-finite (the "mechanism", named as everywhere in nanscope):

    kl-exp-overflow      ref_logp - logp > 88.72: low_var_kl/k3 exp overflows; NaN gradient even at
                         kl-loss-coef 0 and on masked tokens (masking is a multiplication after the exp).
    ratio-exp-overflow   logp - old_logp > 88.72: the PPO ratio exp overflows; NaN gradient.
    nan-rollout-logprob  a NaN rollout log-prob reaches TIS (exp, clamp keep the NaN): NaN loss.
                         (+-inf is clamped to tis_clip / tis_clip_low: finite loss, inf `tis` metric.)
    nan-reward           a non-finite reward, or a group whose normalisation is non-finite (a group of
                         one sample has torch.std = nan): the whole group's advantages are NaN: NaN loss.
    nan-logprob          a NaN old or reference log-prob (train dumps): NaN ratio / KL: NaN loss.

Rollout dumps carry only rollout_log_probs. The log-ratio checks then use bounds: every log-prob is
<= 0, so ref_logp - logp <= -logp and logp - old_logp <= -old_logp, with rollout_log_probs standing in
for logp and old_logp. A bound hit is `certain=False` ("possibly"); dump train data to confirm it.

Every hazard carries `sample` (0-based in the file), `token` (0-based in the response), `abs_token`
(in the whole sequence: prompt_length + token), `masked` (loss_mask 0) and `value`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from nanscope.dumps.io import Dump, SampleData

# Mechanisms in verdict order.
MECHANISMS = ("kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward", "nan-logprob")

# Check kinds in report order -> what they look at.
KINDS: dict[str, str] = {
    "nonfinite-reward": "reward (rollout dump: raw, after --reward-key; train dump: the normalised rewards)",
    "grpo-nonfinite": "GRPO group normalisation of the rewards gives a non-finite advantage",
    "nonfinite-rollout-logprob": "rollout_log_probs (as bf16, as slime feeds TIS)",
    "nonfinite-log-prob": "log_probs (old policy, fp32)",
    "nonfinite-ref-log-prob": "ref_log_probs (fp32)",
    "nonfinite-advantage": "advantages",
    "kl-margin": "ref_logp - logp > 88.72 (low_var_kl / k3 exp)",
    "ratio-margin": "logp - old_logp > 88.72 (PPO ratio exp)",
    "tis-margin": "old_logp - rollout_logp > 88.72 (TIS exp; clamped, so only the tis metric is inf)",
    "length-mismatch": "tokens / response_length / loss_mask / per-token lengths disagree (slime asserts)",
    "zero-loss-mask": "loss_mask all zero (the sample adds nothing, but its tokens still go through exp)",
    "response-too-long": "response_length > --rollout-max-response-len",
}

# Histogram of per-token log-ratios: unit bins on [LO, HI), plus an underflow and an overflow bin.
HIST_LO, HIST_HI = -40, 120


@dataclass(frozen=True)
class ScanConfig:
    """The slime v0.1.0 flags that decide which inputs are hazards (defaults: the slime-795 case)."""

    n_samples_per_prompt: int = 8
    reward_key: str | None = None
    rollout_max_response_len: int | None = 61440
    advantage_estimator: str = "grpo"
    rewards_normalization: bool = True
    grpo_std_normalization: bool = True
    use_kl_loss: bool = True
    kl_loss_type: str = "low_var_kl"
    use_tis: bool = True
    max_listed: int = 100  # hazards listed per (kind, sample); counts are always exact
    histograms: bool = False  # per-token log-ratio histograms (for the HTML plots; ~1/3 of the check time)


@dataclass
class Hazard:
    """One hazard. token/abs_token/masked are None for sample-level hazards."""

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
    """One check's outcome: `count` hazards (exact), `listed` of them in ScanResult.hazards."""

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
    def empty(label: str) -> "Histogram":
        n = HIST_HI - HIST_LO + 2
        return Histogram(label, np.zeros(n, np.int64), np.zeros(n, np.int64))


@dataclass
class ScanResult:
    """Everything a renderer needs. per_sample[i, k] counts hazards of kind list(KINDS)[k] in sample i."""

    path: str
    dump_kind: str
    rollout_id: object
    rank: int | None
    num_samples: int
    response_tokens: int
    config: ScanConfig
    hazards: list[Hazard]
    checks: list[CheckSummary]
    per_sample: np.ndarray
    histograms: dict[str, Histogram]
    errors: list[str]
    would_nan: str  # "yes", "possibly" or "no"
    mechanisms: list[str]  # certain ones first, then possible ones
    verdict: str


# ------------------------------------------------------------------------------------------- collector


class _Collector:
    """Accumulates exact counts, a capped list of hazards, per-sample counts and histograms."""

    def __init__(self, num_samples: int, cfg: ScanConfig):
        self.cfg = cfg
        self.hazards: list[Hazard] = []
        self.counts = dict.fromkeys(KINDS, 0)
        self.listed = dict.fromkeys(KINDS, 0)
        self.mechs: dict[str, dict[str, bool]] = {k: {} for k in KINDS}  # kind -> mechanism -> any certain
        self.per_sample = np.zeros((num_samples, len(KINDS)), np.int64)
        self.col = {k: j for j, k in enumerate(KINDS)}
        self.hist: dict[str, Histogram] = {}
        self.errors: list[str] = []

    def _note(self, kind: str, mechanism: str | None, certain: bool, n: int, sample: int) -> None:
        self.counts[kind] += n
        self.per_sample[sample, self.col[kind]] += n
        if mechanism is not None:
            m = self.mechs[kind]
            m[mechanism] = m.get(mechanism, False) or certain

    def sample_level(self, kind: str, s: SampleData, mechanism: str | None, value, detail: str = "",
                     certain: bool = True) -> None:
        self._note(kind, mechanism, certain, 1, s.sample)
        self.listed[kind] += 1
        self.hazards.append(Hazard(kind, mechanism, s.sample, None, None, None, value, certain, detail))

    def tokens(self, kind: str, s: SampleData, hit: np.ndarray, values: np.ndarray, pos: np.ndarray | None,
               masked: np.ndarray, mechanism: str | None, certain: bool = True) -> None:
        """Record the local entries where `hit` is True (values/masked are local-indexed like hit)."""
        idx = np.flatnonzero(hit)
        if idx.size == 0:
            return
        self._note(kind, mechanism, certain, int(idx.size), s.sample)
        idx = idx[: self.cfg.max_listed]
        self.listed[kind] += int(idx.size)
        tok = idx if pos is None else pos[idx]
        for j, t in zip(idx.tolist(), tok.tolist()):
            self.hazards.append(Hazard(kind, mechanism, s.sample, t, s.prompt_length + t, bool(masked[j]),
                                       float(values[j]), certain))

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


# ----------------------------------------------------------------------------------------- the checks


def scan(dump: Dump, cfg: ScanConfig = ScanConfig(), progress: Callable[[int], None] | None = None) -> ScanResult:
    """Run every check over `dump`, streaming its samples.

    Args:
        dump: from `nanscope.dumps.io.load` (consumed).
        cfg: slime flags that decide what is a hazard.
        progress: called with each sample's response length after it is checked.
    """
    col = _Collector(dump.num_samples, cfg)
    rewards: list[float] = []
    present: set[str] = set()
    response_tokens = 0
    for s in dump.samples():
        response_tokens += s.response_length
        rewards.append(math.nan if s.reward is None else s.reward)
        present.update(k for k in ("rollout_log_probs", "log_probs", "ref_log_probs", "advantages")
                       if getattr(s, k) is not None)
        if s.reward is not None:
            present.add("reward")
        _check_sample(s, dump, cfg, col)
        if progress is not None:
            progress(s.response_length)
    if dump.kind == "rollout":
        _check_groups(rewards, cfg, col, dump.path)
    checks = _summaries(dump, cfg, col, present)
    would, mechs, verdict = _verdict(col)
    col.hazards.sort(key=lambda h: (h.sample, -1 if h.token is None else h.token, list(KINDS).index(h.kind)))
    return ScanResult(dump.path, dump.kind, dump.rollout_id, dump.rank, dump.num_samples, response_tokens, cfg,
                      col.hazards, checks, col.per_sample, col.hist, col.errors, would, mechs, verdict)


def _check_sample(s: SampleData, dump: Dump, cfg: ScanConfig, col: _Collector) -> None:
    if not _check_lengths(s, dump, col):
        return  # per-token positions are meaningless when lengths disagree
    if s.response_length > 0 and not s.loss_mask.any():
        col.sample_level("zero-loss-mask", s, None, 0, "loss_mask sums to 0")
    limit = cfg.rollout_max_response_len
    if limit is not None and s.response_length > limit:
        col.sample_level("response-too-long", s, None, s.response_length,
                         f"response_length {s.response_length} > --rollout-max-response-len {limit}")
    if s.reward is not None and not math.isfinite(s.reward):
        col.sample_level("nonfinite-reward", s, "nan-reward", s.reward)
    _check_tokens(s, dump.kind, cfg, col)


def _check_lengths(s: SampleData, dump: Dump, col: _Collector) -> bool:
    """Length-mismatch hazards (and an error line each: slime v0.1.0 asserts or mis-slices on them)."""
    L, R = s.lengths, s.response_length
    bad: list[tuple[str, int, str]] = []
    if R > s.tokens_length:
        bad.append(("response_length", R, f"response_length {R} > len(tokens) {s.tokens_length}"))
    if "total_lengths" in L and L["total_lengths"] != s.tokens_length:
        bad.append(("total_lengths", L["total_lengths"],
                    f"total_lengths {L['total_lengths']} != len(tokens) {s.tokens_length}"))
    if "loss_mask" in L and L["loss_mask"] != R:
        bad.append(("loss_mask", L["loss_mask"], f"length {L['loss_mask']} != response_length {R}"))
    if not bad:
        expected = R if s.positions is None else len(s.positions)
        what = "response_length" if s.positions is None else f"this CP rank's share ({expected})"
        for key in ("rollout_log_probs", "log_probs", "ref_log_probs", "advantages"):
            if key in L and L[key] != expected:
                hint = ""
                if dump.kind == "train" and dump.cp_size == 1 and L[key] < R:
                    hint = " (CP-sliced? pass --context-parallel-size and --tensor-model-parallel-size)"
                bad.append((key, L[key], f"length {L[key]} != {what} {expected}{hint}"))
    for name, value, text in bad:
        col.sample_level("length-mismatch", s, None, value, f"{name}: {text}")
        col.errors.append(f"{dump.path}: {name} of sample {s.sample}: {text}")
    return not bad


def _check_tokens(s: SampleData, dump_kind: str, cfg: ScanConfig, col: _Collector) -> None:
    """Non-finite per-token values and log-ratio margins, vectorised over the sample's tokens."""
    from nanscope.loss.formulas import FP32_EXP_MAX

    pos = s.positions
    masked = (s.loss_mask == 0) if pos is None else (s.loss_mask[pos] == 0)
    r = None if s.rollout_log_probs is None else _bf16(s.rollout_log_probs)
    lp = None if s.log_probs is None else s.log_probs.astype(np.float32, copy=False)
    ref = None if s.ref_log_probs is None else s.ref_log_probs.astype(np.float32, copy=False)

    if r is not None:
        _nonfinite(col, "nonfinite-rollout-logprob", s, r, s.rollout_log_probs, pos, masked,
                   "nan-rollout-logprob" if cfg.use_tis else None)
    if lp is not None:
        _nonfinite(col, "nonfinite-log-prob", s, lp, lp, pos, masked, "nan-logprob")
    if ref is not None and cfg.use_kl_loss:
        _nonfinite(col, "nonfinite-ref-log-prob", s, ref, ref, pos, masked, "nan-logprob")
    if s.advantages is not None:
        _nonfinite(col, "nonfinite-advantage", s, s.advantages, s.advantages, pos, masked, "nan-reward",
                   inf_mechanism="nan-reward")

    with np.errstate(invalid="ignore", over="ignore"):
        if _kl_applies(cfg):
            if ref is not None and lp is not None:
                _margin(col, "kl-margin", s, ref - lp, pos, masked, "kl-exp-overflow", True, FP32_EXP_MAX)
            elif dump_kind == "rollout" and r is not None:
                _margin(col, "kl-margin", s, -r, pos, masked, "kl-exp-overflow", False, FP32_EXP_MAX)
        old = lp if lp is not None else (r if dump_kind == "rollout" else None)
        if old is not None:
            _margin(col, "ratio-margin", s, -old, pos, masked, "ratio-exp-overflow", False, FP32_EXP_MAX)
        if cfg.use_tis and lp is not None and r is not None:
            _margin(col, "tis-margin", s, lp - r, pos, masked, None, True, FP32_EXP_MAX)


def _kl_applies(cfg: ScanConfig) -> bool:
    """The KL term is computed (and so can overflow) with --use-kl-loss and an exp-based estimator."""
    return cfg.use_kl_loss and cfg.kl_loss_type in ("low_var_kl", "k3")


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 and widen back to fp32, as slime v0.1.0 stores rollout_log_probs for training.

    Same arithmetic as torch's float -> bfloat16 (c10 round_to_nearest_even): via float32, then round
    the low 16 bits to nearest-even; NaN stays NaN, values past bf16's max become inf. numpy bit
    arithmetic, ~10x faster than a torch round trip.
    """
    with np.errstate(over="ignore"):  # float64 beyond float32's range -> inf, as in torch
        f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    r = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(f), f, r)


def _nonfinite(col: _Collector, kind: str, s: SampleData, x: np.ndarray, shown: np.ndarray, pos, masked,
               nan_mechanism: str | None, inf_mechanism: str | None = None) -> None:
    """Hazards where x is NaN (nan_mechanism) or +-inf (inf_mechanism); `shown` gives reported values."""
    bad = ~np.isfinite(x)
    if not bad.any():
        return
    nan = np.isnan(x)
    col.tokens(kind, s, nan, shown, pos, masked, nan_mechanism)
    col.tokens(kind, s, bad & ~nan, shown, pos, masked, inf_mechanism)


def _margin(col: _Collector, kind: str, s: SampleData, x: np.ndarray, pos, masked, mechanism: str | None,
            certain: bool, limit: float) -> None:
    """Hazards where the fp32 log-ratio (or its bound) x exceeds the exp limit; x goes into a histogram."""
    if col.cfg.histograms:
        col.histogram(kind, KINDS[kind], x, masked)
    col.tokens(kind, s, x > limit, x, pos, masked, mechanism, certain)


def _check_groups(rewards: list[float], cfg: ScanConfig, col: _Collector, path: str) -> None:
    """Run slime v0.1.0's group normalisation (post_process_rewards) and flag non-finite outputs."""
    import torch

    from nanscope.loss.formulas import grpo_normalize

    if cfg.advantage_estimator not in ("grpo", "gspo", "reinforce_plus_plus_baseline"):
        return
    if not cfg.rewards_normalization or not rewards:
        return
    n = cfg.n_samples_per_prompt
    if len(rewards) % n:
        col.errors.append(
            f"{path}: samples: {len(rewards)} samples do not form groups of --n-samples-per-prompt {n} "
            f"({len(rewards)} % {n} = {len(rewards) % n}): slime v0.1.0's reshape(-1, {n}) fails")
        return
    std = cfg.grpo_std_normalization and cfg.advantage_estimator in ("grpo", "gspo")
    # torch.std of a single element is nan (unbiased): a group of 1 is all-nan by itself.
    with warnings.catch_warnings():  # torch warns on the std of one element; that nan is the point
        warnings.simplefilter("ignore")
        norm = grpo_normalize(torch.tensor(rewards, dtype=torch.float32), n, std).numpy()
    for g in np.flatnonzero(~np.isfinite(norm.reshape(-1, n)).all(axis=1)).tolist():
        lo, hi = g * n, (g + 1) * n
        bad = [i for i in range(lo, hi) if not math.isfinite(rewards[i])]
        if bad:
            why = f"sample {bad[0]}'s reward is {rewards[bad[0]]}"
        elif n == 1 and std:
            why = "group of 1: std of one element is nan"
        else:
            why = "rewards overflow float32"
        for i in range(lo, hi):
            if not math.isfinite(norm[i]):
                s = SampleData(i, 0, 0, 0, np.zeros(0, np.int8))
                col.sample_level("grpo-nonfinite", s, "nan-reward", float(norm[i]),
                                 f"group {g}: {why}")


# ------------------------------------------------------------------------------------- summary, verdict


def _summaries(dump: Dump, cfg: ScanConfig, col: _Collector, present: set[str]) -> list[CheckSummary]:
    out = []
    for kind in KINDS:
        skip = _skip_reason(kind, dump.kind, cfg, present)
        note = skip or _proxy_note(kind, dump.kind, present)
        out.append(CheckSummary(kind, "skipped" if skip else "ran", col.counts[kind], col.listed[kind],
                                [m for m in MECHANISMS if m in col.mechs[kind]], note))
    return out


def _skip_reason(kind: str, dump_kind: str, cfg: ScanConfig, present: set[str]) -> str:
    need = {
        "nonfinite-reward": ("reward",), "nonfinite-rollout-logprob": ("rollout_log_probs",),
        "nonfinite-log-prob": ("log_probs",), "nonfinite-ref-log-prob": ("ref_log_probs",),
        "nonfinite-advantage": ("advantages",),
    }.get(kind, ())
    missing = [k for k in need if k not in present]
    if missing:
        return f"no {missing[0]} in this dump"
    if kind == "grpo-nonfinite":
        if dump_kind == "train":
            return "train dump: rewards already normalised"
        if cfg.advantage_estimator not in ("grpo", "gspo", "reinforce_plus_plus_baseline"):
            return f"--advantage-estimator {cfg.advantage_estimator} has no group normalisation"
        if not cfg.rewards_normalization:
            return "--disable-rewards-normalization"
    if kind == "nonfinite-ref-log-prob" and not cfg.use_kl_loss:
        return "--no-use-kl-loss: ref_log_probs do not reach the loss"
    if kind == "kl-margin":
        if not _kl_applies(cfg):
            return "KL loss off or --kl-loss-type without exp (kl, k2)"
        if dump_kind == "train" and not {"ref_log_probs", "log_probs"} <= present:
            return "needs log_probs and ref_log_probs (only the last pipeline stage has them)"
        if dump_kind == "rollout" and "rollout_log_probs" not in present:
            return "no rollout_log_probs in this dump"
    if kind == "ratio-margin":
        if dump_kind == "train" and "log_probs" not in present:
            return "needs log_probs (only the last pipeline stage has them)"
        if dump_kind == "rollout" and "rollout_log_probs" not in present:
            return "no rollout_log_probs in this dump"
    if kind == "tis-margin":
        if not cfg.use_tis:
            return "--no-use-tis"
        if dump_kind == "rollout":
            return "rollout dump: no old log-probs"
        if not {"log_probs", "rollout_log_probs"} <= present:
            return "needs log_probs and rollout_log_probs"
    return ""


def _proxy_note(kind: str, dump_kind: str, present: set[str]) -> str:
    if kind == "kl-margin":
        if dump_kind == "rollout":
            return "bound -rollout_log_probs (ref_logp <= 0)"
        return "logp = log_probs (exact at the first step)"
    if kind == "ratio-margin":
        src = "rollout_log_probs" if dump_kind == "rollout" else "log_probs"
        return f"bound -{src} (logp <= 0)"
    if kind == "tis-margin":
        return "exact; clamped, no NaN (tis metric inf)"
    if kind == "nonfinite-rollout-logprob":
        return "nan: NaN loss via TIS; +-inf is clamped"
    return ""


def _verdict(col: _Collector) -> tuple[str, list[str], str]:
    certain, possible = set(), set()
    for kind in KINDS:
        for m, c in col.mechs[kind].items():
            (certain if c else possible).add(m)
    possible -= certain
    yes = [m for m in MECHANISMS if m in certain]
    maybe = [m for m in MECHANISMS if m in possible]
    if yes:
        text = f"slime v0.1.0 would produce NaN: yes, via {', '.join(yes)}"
        if maybe:
            text += f"; possibly also via {', '.join(maybe)} (bounds only)"
        return "yes", yes + maybe, text
    if maybe:
        return "possibly", maybe, (f"slime v0.1.0 would produce NaN: possibly, via {', '.join(maybe)} "
                                   "(bounds only: dump train data to confirm)")
    return "no", [], "slime v0.1.0 would produce NaN: no"


def hazard_count(result: ScanResult) -> int:
    """Total hazards found (exact, including those not listed)."""
    return sum(c.count for c in result.checks)
