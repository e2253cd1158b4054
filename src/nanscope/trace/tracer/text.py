"""A TraceReport, a sentinel Reading, or a step traced on every rank, in words (terminal text; JSON is
their to_dict())."""

from __future__ import annotations

from nanscope.trace.sentinels.reading import Reading
from nanscope.trace.tracer.events import Event, TraceReport


def _counts(counts: dict) -> str:
    parts = [f"{counts[kind]} {kind}" for kind in ("nan", "posinf", "neginf") if counts.get(kind)]
    return ", ".join(parts) or "none"


def _produced(event: Event) -> str:
    return {"nan": "NaN", "inf": "inf", "nan+inf": "NaN and inf"}.get(event.produced, "non-finite")


def event_lines(title: str, event: Event | None, first: Event | None, inputs: list) -> list[str]:
    """Lines for one phase: its producer, or why there is none."""
    if event is not None:
        free = {"nan": "NaN-free", "inf": "inf-free"}.get(event.produced, "finite")
        out = [f"{title}: {event.op} produced {_produced(event)} from {free} inputs"]
        if event.node:
            created = f" (created in forward by {event.created_by})" if event.created_by else ""
            out.append(f"  autograd node: {event.node}" + created)
        out.append(f"  module:  {event.module if event.module is not None else '- (outside the watched modules)'}")
        out.append(f"  source:  {event.source or '- (no Python frame outside torch)'}")
        out.append(f"  token:   {event.token_text()}")
        out.append(f"  output:  {event.shape} with {_counts(event.nonfinite)}; first at flat index {event.first_index}")
        out += [f"  input {i}: {summary}" for i, summary in enumerate(event.input_summary)]
        return out
    if first is None:
        return [f"{title}: none (every op output was finite)"]
    if first.allowed:
        return [
            f"{title}: none outside the allow-list; the first non-finite output is allow-listed: {first.op} "
            f"produced {_produced(first)}, {first.where()}; {first.token_text()}"
        ]
    origin = ", ".join(finding.name for finding in inputs) or "a tensor created outside the trace"
    return [
        f"{title}: none; no op turned finite values into non-finite ones: they came from an input ({origin})",
        f"  first non-finite output: {first.op}, {first.where()}; {first.token_text()}",
    ]


def lines(report: TraceReport) -> list[str]:
    """The whole report: inputs, forward, backward."""
    out = []
    if report.inputs:
        out.append("non-finite inputs (present before the step ran):")
        for finding in report.inputs:
            where = ""
            if finding.sample is not None:
                token = f", response token {finding.token}" if finding.token is not None else ""
                mask = (
                    "" if finding.masked is None else (", loss_mask 0 (masked)" if finding.masked else ", loss_mask 1")
                )
                where = f"; first at sample {finding.sample}{token}{mask}"
            out.append(f"  {finding.name}: {_counts(finding.nonfinite)}{where}")
    else:
        out.append("non-finite inputs: none")
    out += event_lines("forward producer", report.forward, report.first_forward, report.inputs)
    out += event_lines("backward producer", report.backward, report.first_backward, report.inputs)
    outcome = report.outcome
    if outcome:
        loss = f"{outcome['loss']:.6g}" + ("" if outcome["loss_finite"] else " (non-finite)")
        out.append(f"outcome: loss {loss}; d loss / d logits has {outcome['grad_nonfinite']} non-finite entries")
    return out


def reading_lines(reading: Reading) -> list[str]:
    """A sentinel reading: the first non-finite module in forward and in backward order."""
    if reading.finite:
        return [f"sentinel step {reading.step}: every module output and parameter gradient finite"]
    out = [f"sentinel step {reading.step}: non-finite values"]
    forward, backward = reading.forward, reading.backward
    out.append(
        "  forward:  "
        + (
            f"first non-finite module output: {forward.module!r}, micro-batch {forward.microbatch} "
            f"(check #{forward.order})"
            if forward
            else "every module output finite"
        )
    )
    out.append(
        "  backward: "
        + (
            f"first non-finite parameter gradient: {backward.param} (module {backward.module!r}), "
            f"micro-batch {backward.microbatch} (check #{backward.order})"
            if backward
            else "every parameter gradient finite"
        )
    )
    if reading.grads:
        more = f" and {len(reading.grads) - 3} more" if len(reading.grads) > 3 else ""
        out.append(f"  accumulated gradients non-finite: {', '.join(reading.grads[:3])}{more}")
    return out


def event_summary(event: Event) -> str:
    """One event on one line: op, autograd node, module, source line, micro-batch, token."""
    node = f" in {event.node}" if event.node else ""
    module = f"module {event.module!r}" if event.module is not None else "outside the watched modules"
    microbatch = f", micro-batch {event.microbatch}" if event.microbatch is not None else ""
    source = event.source or "-"
    return f"{event.op}{node} produced {_produced(event)}, {module}, at {source}{microbatch}; {event.token_text()}"


def summary_lines(report: TraceReport) -> list[str]:
    """The forward and backward producers, one line each."""
    return [
        f"{phase}: " + (event_summary(event) if event is not None else "no op produced a non-finite value")
        for phase, event in (("forward", report.forward), ("backward", report.backward))
    ]


def first_lines(first: dict) -> list[str]:
    """The first producer of each phase over all ranks (nanscope.trace.tracer.step.first_across_ranks)."""
    out = []
    for phase in ("forward", "backward"):
        event = first.get(phase)
        if event is None:
            out.append(f"{phase}: no op produced a non-finite value on any rank")
            continue
        rank = f"rank {event['rank']} (pp {event['pp']}, tp {event['tp']})"
        out.append(f"{phase}: {rank}: {event_summary(Event.from_dict(event))}")
    out += [f"non-finite input on rank {finding['rank']}: {finding['name']}" for finding in first.get("inputs", [])]
    return out
