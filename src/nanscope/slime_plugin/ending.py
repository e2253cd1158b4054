"""The end of a non-finite step: raise, skip, or go on, decided alike on every rank; and the error each rank raises.

    SKIP   NANSCOPE_ON_NONFINITE=skip, and NANSCOPE_SKIP_ON=any or the verdict is transient with nothing else
           left open (`verdict.Verdict.skippable`): every rank zeroes the step's gradients and skips its update
    RAISE  raise mode where Megatron's check fails on some rank (what ends the step without nanscope), or a skip
           mode that does not skip this step: every rank raises, so none waits in a collective for one that did
    GO_ON  raise mode where no rank's Megatron check fails (the check is off, or the value never reached a
           gradient bucket): megatron's finish_grad_sync runs as without nanscope

Every raising rank's error ends with Megatron's own line (`Rank R, node N, device D, iteration I: Unexpected
result nan (message='found NaN in local grad norm ...')`), which logs, Ray and `nanscope doctor` read: its own
where its buckets hold the value, else the one its first-producing peer's check raises. The line before it is
nanscope's: the verdict and the report on a rank that saw the value; on a healthy replica, which ranks saw it.
"""

from __future__ import annotations

from nanscope.slime_plugin import nonfinite
from nanscope.slime_plugin.nonfinite import Sighting
from nanscope.slime_plugin.settings import Settings

SKIP, RAISE, GO_ON = "skip", "raise", "go on"


class PeerNonFinite(RuntimeError):
    """Raised on a rank whose own gradients were finite, with the ranks that saw a non-finite value and Megatron's
    error of one of them: no rank is left waiting in a collective for one that raised."""


def outcome(settings: Settings, verdict, sightings: list[Sighting]) -> str:
    """What every rank does (the same on every rank: settings, verdict and sightings are)."""
    if settings.on_nonfinite == "skip":
        if settings.skip_on == "any" or (verdict is not None and verdict.skippable):
            return SKIP
        return RAISE
    return RAISE if any(s.error for s in sightings) else GO_ON


def error(rank: int, where: dict, sightings: list[Sighting], verdict, report: str | None) -> RuntimeError:
    """The error rank `rank` raises (see the module docstring).

    Args:
        where: {"rollout_id", "step_id"}.
        sightings: every rank's, in rank order (a rank's Megatron error from the first pass, else the rerun's).
        verdict: the rerun's (verdict.Verdict), or None without a rerun.
        report: this rank's report path, if it wrote one.
    """
    step = f"rollout {where['rollout_id']} step {where['step_id']}"
    megatron = nonfinite.first_error(sightings, rank)
    tail = "" if megatron is None else "\n" + megatron.error
    mine = sightings[rank]
    if mine.saw:
        head = verdict.line() if verdict is not None else f"nanscope: rank {rank}: non-finite values at {step}"
        where_ = f" (report {report}, its bundle beside it)" if report else " (no report written: see the warning)"
        return RuntimeError(head + where_ + tail)
    bad = ", ".join(str(r) for r in nonfinite.bad_ranks(sightings)) or "none"
    told = "" if verdict is None else f"; rerun: {verdict.verdict}"
    whose = "" if megatron is None else f"; rank {megatron.rank}'s error follows"
    return PeerNonFinite(
        f"nanscope: rank {rank} stops with its peers: rank(s) {bad} saw non-finite values at {step}{told}; this "
        f"rank's own gradients were finite{whose}{tail}"
    )
