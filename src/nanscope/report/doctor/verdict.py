"""The report's first paragraph: where the failing rank sits, why the job died, which flags enable which
mechanism, and how many catalogued causes remain."""

from __future__ import annotations

from nanscope.launch.candidates import ENABLED, UNDECIDABLE, remaining
from nanscope.report.text import span


def verdict(diagnosis) -> str:
    """The report's first paragraph: where, why it died, which flags enable which mechanism."""
    parts = _rank_sentences(diagnosis) if diagnosis.failing is not None else []
    if diagnosis.traceback is not None and diagnosis.config["check_for_nan_in_loss_and_grad"]:
        parts.append(
            "The job died (instead of skipping the step) because --check-for-nan-in-loss-and-grad is on "
            "and slime runs Megatron's rerun state machine disabled."
        )
    parts.append(_findings_sentence(diagnosis.findings))
    parts.append(_candidates_sentence(diagnosis.candidates))
    return " ".join(parts)


def _rank_sentences(diagnosis) -> list[str]:
    """Where the failing (or asked-for) rank sits and what it reported."""
    rank, layout, traceback = diagnosis.failing, diagnosis.topology, diagnosis.traceback
    reported = traceback is not None and traceback.failure.rank == rank.rank
    if reported:
        failure = traceback.failure
        where = "its local gradient norm" + (f" (bucket #{failure.bucket})" if failure.bucket is not None else "")
        what = (
            f" found {failure.kind} in {where} before the data-parallel reduce, on node {failure.node} "
            f"(node index {rank.node_index}), device {failure.device}."
        )
    else:
        what = f" is on node index {rank.node_index}, local device {rank.local_device}."
        if traceback is not None:
            what += f" (The traceback's failing rank is {traceback.failure.rank}.)"
    last = rank.pp == layout.pp - 1
    stage = "the last pipeline stage" if last else f"pipeline stage {rank.pp} of {layout.pp}"
    layers = ""
    if rank.layers is not None:
        layers = ", " + (f"decoder layers {span(rank.layers)}" if rank.layers else "no decoder layers")
        layers += " plus the final norm and output layer" if rank.holds_output_layer else ""
    parts = [
        f"Rank {rank.rank}{what}",
        f"It is TP {rank.tp} / CP {rank.cp} / DP {rank.dp} / PP {rank.pp} (EP {rank.ep}): {stage}{layers}.",
    ]
    if last and layout.pp > 1 and reported:
        parts.append(
            "The last stage holds the loss and checks its gradients first in 1F1B, so the "
            f"{traceback.failure.kind} can have started in any layer."
        )
    return parts


def _findings_sentence(findings: list) -> str:
    serious = [finding for finding in findings if finding.severity in ("critical", "high")]
    if serious:
        rest = len(findings) - len(serious)
        return (
            f"The flags enable {len(serious)} high-severity mechanism(s): "
            + "; ".join(f"{finding.id} ({', '.join(finding.flags[:3])})" for finding in serious)
            + "."
            + (f" {rest} more finding(s) below." if rest else "")
        )
    if findings:
        return f"{len(findings)} finding(s), none high-severity."
    return "No rule fired."


def _candidates_sentence(candidates: list) -> str:
    """How many catalogued causes the flags leave: never one mechanism while several remain (faults in the
    model are never decided by flags, so at least two always do)."""
    left = remaining(candidates)
    groups = [(ENABLED, "enabled by these flags"), (UNDECIDABLE, "not decidable from flags")]
    said = "; ".join(
        f"{', '.join(candidate.id for candidate in left if candidate.status == status)} {words}"
        for status, words in groups
        if any(candidate.status == status for candidate in left)
    )
    return (
        f"{len(left)} catalogued causes remain ({said}), so the flags alone do not say which one fired: "
        "each candidate below names the one observation that tells it apart."
    )
