"""The scan's checks, one `Check` record each in `CHECKS` (report order), and `scan`, which runs them over a dump.

Each check looks at what slime's loss would compute from a sample and reports the inputs that make it
non-finite (the "mechanism", named as in `nanscope.hazards`; `nanscope.dumps.verdict`). The checks are the
same for every dump format (`nanscope.dumps.formats`); the format decides the dtype the rollout log-probs
are checked in (bf16 as v0.1.0's trainer holds them, fp32 from v0.2.4) and the release the verdict names.

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

A record holds a check's kind, what it looks at, its function (`nanscope.dumps.sample_checks`, or the
per-rollout `nanscope.dumps.group_checks`), when it is skipped and its note. What a scan finds is
`nanscope.dumps.result`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nanscope.dumps import group_checks, sample_checks
from nanscope.dumps.collector import Collector
from nanscope.dumps.dump import Dump
from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.result import CheckSummary, ScanResult
from nanscope.dumps.verdict import MECHANISMS, SIGNALS, verdict
from nanscope.facts import releases

# ---------------------------------------------------------------------------------------- skip reasons
# Each: (flags, dump kind, present fields) -> why the check does not run, "" when it runs. Evaluated per
# sample (with that sample's fields) to decide whether to run, and once over the whole dump for the summary.


def _never(flags: ScanFlags, dump_kind: str, present: set[str]) -> str:
    return ""


def _needs(name: str) -> Callable[[ScanFlags, str, set[str]], str]:
    return lambda flags, dump_kind, present: "" if name in present else f"no {name} in this dump"


def _skip_groups(flags: ScanFlags, dump_kind: str, present: set[str]) -> str:
    if dump_kind == "train":
        return "train dump: rewards already normalised"
    if flags.advantage_estimator not in releases.GROUP_NORMALISED:
        return f"--advantage-estimator {flags.advantage_estimator} has no group normalisation"
    if not flags.rewards_normalization:
        return "--disable-rewards-normalization"
    return ""


def _skip_ref(flags: ScanFlags, dump_kind: str, present: set[str]) -> str:
    if "ref_log_probs" not in present:
        return "no ref_log_probs in this dump"
    return "" if flags.use_kl_loss else "--no-use-kl-loss: ref_log_probs do not reach the loss"


def _kl_applies(flags: ScanFlags) -> bool:
    """The KL term is computed (and so can overflow) with --use-kl-loss and an exp-based estimator."""
    return flags.use_kl_loss and flags.kl_loss_type in ("low_var_kl", "k3")


def _skip_kl(flags: ScanFlags, dump_kind: str, present: set[str]) -> str:
    if not _kl_applies(flags):
        return "KL loss off or --kl-loss-type without exp (kl, k2)"
    if dump_kind == "train" and not {"ref_log_probs", "log_probs"} <= present:
        return "needs log_probs and ref_log_probs (only the last pipeline stage has them)"
    if dump_kind == "rollout" and "rollout_log_probs" not in present:
        return "no rollout_log_probs in this dump"
    return ""


def _skip_ratio(flags: ScanFlags, dump_kind: str, present: set[str]) -> str:
    if dump_kind == "train" and "log_probs" not in present:
        return "needs log_probs (only the last pipeline stage has them)"
    if dump_kind == "rollout" and "rollout_log_probs" not in present:
        return "no rollout_log_probs in this dump"
    return ""


def _skip_tis(flags: ScanFlags, dump_kind: str, present: set[str]) -> str:
    if not flags.use_tis:
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
        run: per-sample checks take a `sample_checks.SampleView`; a False return (the length gate) stops
            that sample's remaining checks. Rollout-level checks (`per_rollout`) take a
            `group_checks.RolloutView` once, after every sample.
        skip: (flags, dump kind, present fields) -> why it does not run, "" when it runs.
        note: dump kind -> the caveat shown in the summary when it ran.
        per_rollout: runs once over the rollout's rewards instead of per sample.
        gate: runs before the other per-sample checks, whose positions need it to pass.
    """

    kind: str
    looks_at: str
    run: Callable
    skip: Callable[[ScanFlags, str, set[str]], str] = _never
    note: Callable[[str], str] = lambda dump_kind: ""
    per_rollout: bool = False
    gate: bool = False


CHECKS: tuple[Check, ...] = (
    Check(
        "nonfinite-reward",
        "reward (rollout dump: raw, after --reward-key; train dump: the normalised rewards)",
        sample_checks.check_reward,
        _needs("reward"),
    ),
    Check(
        "grpo-nonfinite",
        "GRPO group normalisation of the rewards gives a non-finite advantage",
        group_checks.check_groups,
        _skip_groups,
        per_rollout=True,
    ),
    Check(
        "nonfinite-rollout-logprob",
        "rollout_log_probs (in the dtype slime feeds TIS: bf16 in v0.1.0, fp32 from v0.2.4)",
        sample_checks.check_rollout_logprob,
        _needs("rollout_log_probs"),
        lambda dump_kind: "nan: NaN loss via TIS; +-inf is clamped",
    ),
    Check("nonfinite-log-prob", "log_probs (old policy, fp32)", sample_checks.check_log_prob, _needs("log_probs")),
    Check("nonfinite-ref-log-prob", "ref_log_probs (fp32)", sample_checks.check_ref_log_prob, _skip_ref),
    Check("nonfinite-advantage", "advantages", sample_checks.check_advantage, _needs("advantages")),
    Check(
        "kl-margin",
        "ref_logp - logp > 88.72 (low_var_kl / k3 exp)",
        sample_checks.check_kl,
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
        sample_checks.check_ratio,
        _skip_ratio,
        lambda dump_kind: f"bound -{'rollout_log_probs' if dump_kind == 'rollout' else 'log_probs'} (logp <= 0)",
    ),
    Check(
        "tis-margin",
        "old_logp - rollout_logp > 88.72 (TIS exp; clamped, so only the tis metric is inf)",
        sample_checks.check_tis,
        _skip_tis,
        lambda dump_kind: "exact; clamped, no NaN (tis metric inf)",
    ),
    Check(
        "logprob-mismatch",
        f"median |log_probs - rollout_log_probs| > {sample_checks.SHIFT_MEDIAN_NATS:g} nat on trained tokens "
        "(misaligned rollout log-probs)",
        sample_checks.check_mismatch,
        _skip_tis,
        lambda dump_kind: "loss stays finite; TIS weights and the tis metric are off",
    ),
    Check(
        "length-mismatch",
        "tokens / response_length / loss_mask / per-token lengths disagree (slime asserts)",
        sample_checks.check_lengths,
        gate=True,
    ),
    Check(
        "zero-loss-mask",
        "loss_mask all zero (the sample adds nothing, but its tokens still go through exp)",
        sample_checks.check_zero_loss_mask,
    ),
    Check("response-too-long", "response_length > --rollout-max-response-len", sample_checks.check_too_long),
)
BY_KIND = {check.kind: check for check in CHECKS}
KINDS = tuple(BY_KIND)  # report order; the columns of ScanResult.per_sample
_LOOKS_AT = {check.kind: check.looks_at for check in CHECKS}
_PER_SAMPLE = tuple(sorted((check for check in CHECKS if not check.per_rollout), key=lambda check: not check.gate))


# ------------------------------------------------------------------------------------------------ scan


def scan(
    dump: Dump,
    flags: ScanFlags,
    progress: Callable[[int], None] | None = None,
    observe: Callable[[sample_checks.SampleView], None] | None = None,
) -> ScanResult:
    """Run every check over `dump`, streaming its samples.

    Args:
        dump: from `nanscope.dumps.io.load` (consumed).
        flags: slime flags that decide what is a hazard (the case's: `nanscope.case.scan_config()`).
        progress: called with each sample's response length after it is checked.
        observe: called with each sample's view whose lengths agree, after its checks (a directory scan's
            headroom, `nanscope.dumps.headroom`).
    """
    collector = Collector(flags, _LOOKS_AT)
    rewards: list[float] = []
    present: set[str] = set()
    response_tokens = 0
    for data in dump.samples():
        response_tokens += data.response_length
        rewards.append(math.nan if data.reward is None else data.reward)
        view = sample_checks.SampleView(data, dump, flags, collector)
        present |= view.present
        if _check_sample(view) and observe is not None:
            observe(view)
        if progress is not None:
            progress(data.response_length)
    rollout = group_checks.RolloutView(dump.path, rewards, flags, collector)
    for check in CHECKS:
        if check.per_rollout and not check.skip(flags, dump.kind, present):
            check.run(rollout)
    summaries = [_summary(check, dump.kind, flags, collector, present) for check in CHECKS]
    would_nan, mechanisms, text = verdict(collector.mechanisms, dump.format.release)
    collector.hazards.sort(key=lambda h: (h.sample, -1 if h.token is None else h.token, KINDS.index(h.kind)))
    return ScanResult(
        path=dump.path,
        dump_kind=dump.kind,
        rollout_id=dump.rollout_id,
        rank=dump.rank,
        num_samples=dump.num_samples,
        response_tokens=response_tokens,
        flags=flags,
        hazards=collector.hazards,
        checks=summaries,
        per_sample=collector.per_sample(dump.num_samples),
        histograms=collector.hist,
        errors=collector.errors,
        would_nan=would_nan,
        mechanisms=mechanisms,
        verdict=text,
        format=dump.format,
    )


def _check_sample(view: sample_checks.SampleView) -> bool:
    """Run the sample's checks; False when the length gate stopped them (its positions are meaningless)."""
    with np.errstate(invalid="ignore", over="ignore"):
        for check in _PER_SAMPLE:
            if check.skip(view.flags, view.dump.kind, view.present):
                continue
            if check.run(view) is False:
                return False
    return True


def _summary(check: Check, dump_kind: str, flags: ScanFlags, collector: Collector, present: set[str]) -> CheckSummary:
    skip = check.skip(flags, dump_kind, present)
    return CheckSummary(
        kind=check.kind,
        status="skipped" if skip else "ran",
        count=collector.counts[check.kind],
        listed=collector.listed[check.kind],
        mechanisms=[m for m in MECHANISMS + SIGNALS if m in collector.mechanisms[check.kind]],
        note=skip or check.note(dump_kind),
    )
