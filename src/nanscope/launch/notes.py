"""What doctor says about its inputs, besides the causes: the explanations of the failing rank's error, the notes on
the inputs (files sourced, values kept as text, a traceback cut short, other failing ranks), and where the traceback
and the launch script disagree."""

from __future__ import annotations

from nanscope.facts import frameworks
from nanscope.launch.config import Config
from nanscope.launch.diagnosis import Diagnosis
from nanscope.launch.failure import Failure
from nanscope.launch.script import LaunchScript
from nanscope.launch.tracebacks import (
    Traceback,
    explain_bucket,
    explain_check,
    explain_iteration,
    explain_stage,
)

_RANKS_SHOWN = 16  # other failing ranks named in the note; the rest are counted


def explain_alone(traceback: Traceback) -> list[str]:
    """What the traceback's failure says without a layout: its stage (from the frames), iteration, bucket, check."""
    failure, evidence = traceback.failure, traceback.evidence
    out = []
    if evidence.pp is not None:
        out.append(explain_stage(1 if evidence.pp == "1" else 2, None, failure.check if failure else None))
    if failure is None:
        return out
    return out + _failure_lines(failure, traceback.framework.name, None, False)


def _failure_lines(failure: Failure, framework: str, pp: int | None, overlap: bool) -> list[str]:
    """The failure's iteration, bucket and check, explained (each only where the failure names it)."""
    out = [explain_iteration(failure.iteration, framework)] if failure.iteration is not None else []
    bucket = explain_bucket(failure.bucket, pp, overlap)
    check = explain_check(failure) if failure.message and failure.format != "signal" else ""  # Megatron's forms only
    return out + [text for text in (bucket, check) if text]


def traceback_notes(diagnosis: Diagnosis, traceback_origin: str) -> list[str]:
    """What the traceback says about itself: cut short, a check this launch does not run, other failing ranks."""
    traceback = diagnosis.traceback
    failure = traceback.failure if traceback is not None else None
    notes = [f"{traceback_origin}: {note}" for note in traceback.notes] if traceback is not None else []
    if failure is not None and failure.truncated:
        notes.append(
            f"{traceback_origin}: line {failure.line}: the Megatron error is cut short before its end; it is read "
            "as far as it goes"
        )
    if failure is not None and failure.ambiguous:
        notes.append(
            f"the message cut short fits {', '.join([failure.check.id, *failure.ambiguous])}; "
            f"read as {failure.check.id}, the likeliest"
        )
    check, cfg = (failure.check if failure is not None else None), diagnosis.config
    off = None
    if check is not None and cfg is not None and check.id == "large-grads" and not cfg["check_for_large_grads"]:
        off = "--check-for-large-grads, which this launch does not set"
    elif check is not None and cfg is not None and check.quantity == "gradient" and not cfg["check_for_nan_in_loss_and_grad"]:  # fmt: skip
        off = "--check-for-nan-in-loss-and-grad, which this launch turns off"
    if off is not None:
        notes.append(
            f"the traceback's check ({check.id}) runs only under {off}: the traceback may come from another launch"
        )
    if traceback is not None and traceback.other_ranks:
        shown, more = traceback.other_ranks[:_RANKS_SHOWN], len(traceback.other_ranks) - _RANKS_SHOWN
        first = f"the first, rank {failure.rank}, is explained" if failure is not None else "the first is explained"
        notes.append(
            f"the traceback also has Megatron errors from rank(s) {', '.join(map(str, shown))}"
            + (f" and {more} more" if more > 0 else "")
            + f"; {first}"
        )
    return notes


def contradictions(diagnosis: Diagnosis) -> list[str]:
    """Where the traceback and the launch script disagree: stated, never ignored."""
    traceback, layout = diagnosis.traceback, diagnosis.topology
    if traceback is None or layout is None:
        return []
    out = []
    evidence, frames = traceback.evidence, traceback.framework
    pp = f"--pipeline-model-parallel-size {layout.pp}"
    if evidence.pp == "1" and layout.pp > 1:
        out.append(f"the frames run forward_backward_no_pipelining (PP 1) but the script sets {pp}")
    elif evidence.pp == ">1" and layout.pp == 1:
        out.append(f"the frames run a pipelined schedule ({evidence.schedule}: PP > 1) but the script runs PP 1")
    if evidence.vpp and not layout.vpp and layout.pp > 1:
        out.append("the frames run the interleaved schedule (virtual stages) but the script sets no virtual stages")
    elif evidence.vpp is False and evidence.pp == ">1" and layout.vpp:
        out.append(f"the frames run 1F1B without interleaving but the script sets {layout.vpp} virtual stages")
    script = diagnosis.framework.name
    if frames.name not in (script, "unknown"):
        out.append(f"the traceback's frames are {frames.name}'s ({frames.how}) but the launch script is {script}'s")
    chosen = diagnosis.release
    if frames.release is not None and chosen is not None and chosen.release.key != frames.release:
        out.append(
            f"the frames are slime {frames.release}'s lines but the diagnosis uses {chosen.release.key} "
            f"({chosen.how}: {chosen.source})"
        )
    return out


def input_notes(script: LaunchScript, cfg: Config, model: dict | None, model_origin: str | None) -> list[str]:
    notes = []
    for source in script.sources:
        if source.status == "missing":
            where = f"; {model_origin} stands in for it" if model else "; pass --model-args FILE or --model JSON"
            notes.append(f"line {source.line}: source {source.path}: {source.reason}{where}")
        elif source.followed != source.path:
            notes.append(f"line {source.line}: source {source.path}: read {source.followed} in its place")
        else:
            notes.append(f"line {source.line}: source {source.path}: followed")
    arrays = script.unset_arrays
    scalars = [name for name in script.unset if name not in arrays]
    if arrays:
        notes.append("unset arrays expanded to nothing: " + ", ".join(arrays))
    if scalars:
        notes.append("unset variables kept as text: " + ", ".join(scalars) + " (pass --env NAME=VALUE)")
    for placeholder in script.placeholders:
        if placeholder.kind == "command":
            notes.append(f"line {placeholder.line}: {placeholder.text} is a run-time value, kept as text")
    notes += (
        ([script.pasted] if script.pasted else [])
        + ([script.cut] if script.cut else [])
        + script.assumptions
        + script.limits
    )
    for name in ("num_layers", "num_experts"):
        if model and cfg.origin(name) == model_origin:
            notes.append(f"{name.replace('_', '-')} {cfg[name]} from {model_origin}")
    if script.syntax_errors:
        notes.append("tree-sitter reported syntax errors at lines " + ", ".join(map(str, script.syntax_errors)))
    return notes


def explain(diagnosis: Diagnosis) -> list[str]:
    layout, failing, traceback = diagnosis.topology, diagnosis.failing, diagnosis.traceback
    check = traceback.failure.check if traceback is not None and traceback.failure is not None else None
    out = [explain_stage(layout.pp, failing.pp, check)]
    failure = traceback.failure if traceback is not None else None
    if failure is not None:
        known = failure.rank is not None and failure.rank < layout.world
        pp = layout.coord(failure.rank)["pp"] if known else failing.pp
        overlap = diagnosis.config["overlap_grad_reduce"] if diagnosis.config is not None else False
        out += _failure_lines(failure, diagnosis.framework.name, pp, overlap)
    return out


def script_adds(failure, framework) -> str:
    """What a launch script would add to a traceback alone (`framework`: launch.evidence.Framework): the layout of a
    job with Megatron-LM's parallelism (megatron-core's, or a copy's), and the flags that decide the causes."""
    copy = framework.name in frameworks.MEGATRON_COPIES  # Megatron-LM's layout, without megatron-core
    if (framework.name in frameworks.WITHOUT_MEGATRON and not copy) or framework.stack is not None:  # no layout
        return "no launch script: give it to read the flags that enable or rule out each cause"
    where = f"rank {failure.rank}" if failure is not None and failure.rank is not None else "the failing rank"
    return (f"no launch script: give it to place {where} in the layout (its TP/CP/DP/PP/EP coordinates, node and "
            "layers), to read the flags that enable or rule out each cause, and to check the frames against the "
            "layout")  # fmt: skip
