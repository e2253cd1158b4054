"""A TraceReport, a sentinel Reading, or a step traced on every rank, in words (terminal text; JSON is
their to_dict())."""

from __future__ import annotations

from nanscope.trace.locator import Event, TraceReport
from nanscope.trace.sentinel import Reading


def _counts(c: dict) -> str:
    parts = [f"{c[k]} {k}" for k in ("nan", "posinf", "neginf") if c.get(k)]
    return ", ".join(parts) or "none"


def _produced(e: Event) -> str:
    return {"nan": "NaN", "inf": "inf", "nan+inf": "NaN and inf"}.get(e.produced, "non-finite")


def event_lines(title: str, e: Event | None, first: Event | None, inputs: list) -> list[str]:
    """Lines for one phase: its producer, or why there is none."""
    if e is not None:
        free = {"nan": "NaN-free", "inf": "inf-free"}.get(e.produced, "finite")
        out = [f"{title}: {e.op} produced {_produced(e)} from {free} inputs"]
        if e.node:
            out.append(
                f"  autograd node: {e.node}" + (f" (created in forward by {e.created_by})" if e.created_by else "")
            )
        out.append(f"  module:  {e.module if e.module is not None else '- (outside the watched modules)'}")
        out.append(f"  source:  {e.source or '- (no Python frame outside torch)'}")
        out.append(f"  token:   {e.token_text()}")
        out.append(f"  output:  {e.shape} with {_counts(e.nonfinite)}; first at flat index {e.first_index}")
        out += [f"  input {i}: {s}" for i, s in enumerate(e.input_summary)]
        return out
    if first is None:
        return [f"{title}: none (every op output was finite)"]
    if first.allowed:
        return [
            f"{title}: none outside the allow-list; the first non-finite output is allow-listed: {first.op} "
            f"produced {_produced(first)}, {first.where()}; {first.token_text()}"
        ]
    origin = ", ".join(i.name for i in inputs) or "a tensor created outside the trace"
    return [
        f"{title}: none; no op turned finite values into non-finite ones: they came from an input ({origin})",
        f"  first non-finite output: {first.op}, {first.where()}; {first.token_text()}",
    ]


def lines(report: TraceReport) -> list[str]:
    """The whole report: inputs, forward, backward."""
    out = []
    if report.inputs:
        out.append("non-finite inputs (present before the step ran):")
        for i in report.inputs:
            where = ""
            if i.sample is not None:
                where = f"; first at sample {i.sample}" + (f", response token {i.token}" if i.token is not None else "")
                where += "" if i.masked is None else (", loss_mask 0 (masked)" if i.masked else ", loss_mask 1")
            out.append(f"  {i.name}: {_counts(i.nonfinite)}{where}")
    else:
        out.append("non-finite inputs: none")
    out += event_lines("forward producer", report.forward, report.first_forward, report.inputs)
    out += event_lines("backward producer", report.backward, report.first_backward, report.inputs)
    o = report.outcome
    if o:
        loss = f"{o['loss']:.6g}" + ("" if o["loss_finite"] else " (non-finite)")
        out.append(f"outcome: loss {loss}; d loss / d logits has {o['grad_nonfinite']} non-finite entries")
    return out


def reading_lines(reading: Reading) -> list[str]:
    """A sentinel reading: the first non-finite module in forward and in backward order."""
    if reading.finite:
        return [f"sentinel step {reading.step}: every module output and parameter gradient finite"]
    out = [f"sentinel step {reading.step}: non-finite values"]
    f, b = reading.forward, reading.backward
    out.append(
        "  forward:  "
        + (
            f"first non-finite module output: {f.module!r}, micro-batch {f.microbatch} (check #{f.order})"
            if f
            else "every module output finite"
        )
    )
    out.append(
        "  backward: "
        + (
            f"first non-finite parameter gradient: {b.param} (module {b.module!r}), micro-batch {b.microbatch} "
            f"(check #{b.order})"
            if b
            else "every parameter gradient finite"
        )
    )
    if reading.grads:
        more = f" and {len(reading.grads) - 3} more" if len(reading.grads) > 3 else ""
        out.append(f"  accumulated gradients non-finite: {', '.join(reading.grads[:3])}{more}")
    return out


def event_summary(e: Event) -> str:
    """One event on one line: op, autograd node, module, source line, micro-batch, token."""
    node = f" in {e.node}" if e.node else ""
    module = f"module {e.module!r}" if e.module is not None else "outside the watched modules"
    mb = f", micro-batch {e.microbatch}" if e.microbatch is not None else ""
    return f"{e.op}{node} produced {_produced(e)}, {module}, at {e.source or '-'}{mb}; {e.token_text()}"


def summary_lines(report: TraceReport) -> list[str]:
    """The forward and backward producers, one line each."""
    return [
        f"{phase}: " + (event_summary(e) if e is not None else "no op produced a non-finite value")
        for phase, e in (("forward", report.forward), ("backward", report.backward))
    ]


def first_lines(first: dict) -> list[str]:
    """The first producer of each phase over all ranks (nanscope.trace.step.first_across_ranks)."""
    out = []
    for phase in ("forward", "backward"):
        e = first.get(phase)
        if e is None:
            out.append(f"{phase}: no op produced a non-finite value on any rank")
            continue
        out.append(f"{phase}: rank {e['rank']} (pp {e['pp']}, tp {e['tp']}): {event_summary(Event.from_dict(e))}")
    out += [f"non-finite input on rank {i['rank']}: {i['name']}" for i in first.get("inputs", [])]
    return out
