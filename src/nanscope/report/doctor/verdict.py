"""The report's first paragraph: where the failing rank sits, why the job died, which flags enable which
mechanism, and how many catalogued causes remain."""

from __future__ import annotations

from nanscope.facts import frameworks
from nanscope.launch import native_errors
from nanscope.launch.candidates import ENABLED, UNDECIDABLE, remaining
from nanscope.launch.evidence import UNCATALOGUED
from nanscope.launch.other_stacks import MEGATRON_CAUSES
from nanscope.launch.scales import LOSS_ITSELF, forward_loss, shown, where_words
from nanscope.launch.summary import read_metric_lines
from nanscope.report.doctor.evidence_text import (
    MODEL_WORDS,
    balanced,
    code_sentences,
    earlier_sentence,
    first_sentence,
    forward_sentence,
    signal_sentence,
)
from nanscope.report.text import span


def verdict(diagnosis) -> str:
    """The report's first paragraph: where, why it died, which flags enable which mechanism."""
    traceback = diagnosis.traceback
    failure = traceback.failure if traceback is not None else None
    if diagnosis.failing is not None:
        parts = _rank_sentences(diagnosis)
    else:
        parts = _failure_sentences(diagnosis)
    if failure is not None and failure.format not in ("rerun", "signal"):
        parts += _iteration_sentence(failure, diagnosis.summary)
        parts += _why_it_died(failure, diagnosis.config)
    parts += _metric_sentences(diagnosis)
    parts += _model_sentence(diagnosis.summary)
    if traceback is not None and traceback.rerun is not None:
        rerun = traceback.rerun
        parts.append(f"The rerun state machine's verdict ({rerun.rerun} rerun): {rerun.means}.")
    if diagnosis.script is not None and diagnosis.script.cut:
        parts.append(f"The launch script's train command is cut short: {diagnosis.script.cut}.")
    if diagnosis.script is not None and diagnosis.script.earlier:
        parts.append(_commands_sentence(diagnosis.script))
    if diagnosis.script is None:
        parts.append(_framework_sentence(diagnosis))
        if diagnosis.unread_script:
            parts.append(f"The input given as the launch script: {diagnosis.unread_script}.")
        parts.append("No launch script: no flag rule ran, and no flag decides a cause.")
    elif diagnosis.config is None:
        parts.append(_framework_sentence(diagnosis))
        name = diagnosis.framework.name
        if name == "unknown":
            parts.append("slime's rules do not apply to it.")
        else:
            parts.append(f"slime's rules do not apply: the launch is {_owner(name)}, and each cause is weighed by "
                         f"{_owner(name)} own code and flags.")  # fmt: skip
        if diagnosis.run_kind is not None:
            kind = diagnosis.run_kind
            ruled = (
                ""
                if kind.rollouts
                else ": the RL causes (a KL's or a ratio's exp, a reward's NaN, rollout log-probs) are ruled out"
            )
            parts.append(f"The run is {kind.words()} ({kind.how}){ruled}.")
        if diagnosis.findings:
            parts.append(
                "The launch script gives values that are no size: "
                + "; ".join(finding.title for finding in diagnosis.findings)
                + "; no layout is built."
            )
    else:
        parts.append(_findings_sentence(diagnosis.findings))
    parts += _core_sentence(diagnosis)
    parts.append(_candidates_sentence(diagnosis.candidates))
    return " ".join(parts)


def _ended(error: str) -> str:
    """An error line as the end of a verdict's sentence: balanced, one closing mark (its own `?` or `!`, else `.`)."""
    shown = balanced(error).rstrip(".")
    return shown if shown.endswith(("?", "!")) else shown + "."


def _model_sentence(summary) -> list[str]:
    """The model an error's words or the run's kind point to, where no metric line names it (launch.failure_models)."""
    if summary is None or summary.model_from is None or summary.metric is not None:
        return []
    return [f"The model: {MODEL_WORDS.get(summary.model, summary.model)} ({summary.model_from})."]


def _metric_sentences(diagnosis) -> list[str]:
    """The metric lines' part: the first non-finite metric (or a contradicted one, or a loss Megatron did not
    print, said as the weak evidence it is), a first line cut at its start, the loss scaler's series."""
    summary, traceback = diagnosis.summary, diagnosis.traceback
    if summary is None or traceback is None:
        return []
    metrics, parts = traceback.nonfinite.metrics, []
    weak = metrics.weak
    based_on_weak = metrics.first is None and weak is not None and summary.lines.get("metric") == weak.line
    first = first_sentence(summary, weak=based_on_weak, counters=metrics.counters)
    if first is not None:
        parts.append(first)
    if traceback.metrics.zeroed is not None:
        parts.append(f"Its {traceback.metrics.zeroed.text()}.")
    reading = metrics.first
    if reading is not None and metrics.episodes.again is not None and first is not None:
        parts.append(metrics.episodes.again.sentence(reading.step))
    if (graver := metrics.graver) is not None and first is not None:
        at = f"at step {graver.step} " if graver.step is not None else ""
        at = f"after step {graver.after} " if graver.after is not None else at  # the bar before it
        parts.append(f"A model's own value went non-finite later: {graver.metric} {at}(line {graver.line}): "
                     f"{graver.points_to}.")  # fmt: skip
    if reading is not None and reading.fragment is not None:
        step = f" at or before step {reading.step}" if reading.step is not None else " before this line"
        parts.append(f"{balanced(reading.fragment[0].upper() + reading.fragment[1:])}: the first non-finite value is"
                     f"{step}.")  # fmt: skip
    if weak is not None and not based_on_weak:
        step = f"at step {weak.step} " if weak.step is not None else ""
        parts.append(f"The iteration line {step}(line {weak.line}) prints no {weak.metric}: Megatron prints an average "
                     "loss only when it is > 0, so it was NaN, <= 0 or not reported; weak evidence alone, not the "
                     "failure.")  # fmt: skip
    failure = traceback.failure
    if failure is not None and failure.signal is not None and failure.signal.id.endswith("overflow"):
        first = traceback.nonfinite.metrics.first  # a non-finite value, whatever step it names: no probe
        finite = first is None or first.contradicted is not None
        said = traceback.nonfinite.scales.sentence(traceback.nonfinite.loss_step(), finite)
        if said:
            parts.append(said)
    collapsed = metrics.scale.collapsed
    if collapsed is None and (failure is None or not failure.signal or not failure.signal.id.endswith("overflow")):
        parts += [said] if (said := metrics.scale.sentence()) is not None else []  # the overflow lines' series said it
    if collapsed is None and (said := metrics.scale.uncounted_sentence()) is not None:
        parts.append(said)
    if collapsed is None and (said := metrics.scale.unmoved.sentence(shown)) is not None:
        parts.append(said)
    if collapsed is not None and (said := metrics.scale.log2_sentence()) is not None:
        parts.append(said)
    elif collapsed is not None:
        scale, where = collapsed
        drop = metrics.scale.drop
        fell = f" (it fell from {shown(drop[0])} at {where_words(*drop[2])})" if drop is not None else ""
        parts.append(f"The loss scale its metric lines print is {shown(scale)} at {where_words(*where)}{fell}: below "
                     "2^-10, a dynamic loss scaler halved it on overflow after overflow, far below any start: the "
                     "gradients overflow step after step, not a calibration.")  # fmt: skip
    scaled = failure is not None and failure.signal is not None and failure.signal.id.endswith("overflow")
    for line, text in traceback.native:  # what a native error line's negative size says, where it says one
        if (what := native_errors.meaning(text)) is not None:
            parts.append(f"A native error line (line {line}, naming no NaN) {what.removeprefix('it ')}.")
            break
    said_once = any(LOSS_ITSELF in part for part in parts)  # a calibrating scale's sentence said it
    if (scaled or collapsed is not None) and not said_once and (said := forward_loss(reading)) is not None:
        parts.append(said)
    if (
        summary.benign is not None
        and summary.contradicted is None
        and not summary.benign.startswith("the fp16 loss scale")
    ):
        parts.append(f"Not a NaN failure by itself: {summary.benign}.")
    return parts


def _core_sentence(diagnosis) -> list[str]:
    """What is unknown about megatron-core: its causes are not offered where nothing points to it."""
    stack = diagnosis.framework.stack
    if stack in frameworks.TOKEN_FREE:  # a named stack's model: megatron-core's causes and a token count not its own
        return [f"{frameworks.TOKEN_FREE[stack]}: its loss divides by no count of tokens, and nothing in the input "
                "points to megatron-core, so neither empty-micro-batch nor megatron-core's own causes are offered."]  # fmt: skip
    if diagnosis.megatron_core is not None or diagnosis.framework.name in frameworks.WITHOUT_MEGATRON:
        return []
    return [f"Nothing in the input points to megatron-core, so its own causes ({', '.join(MEGATRON_CAUSES)}) are "
            "not offered; a launch script or frames through megatron/core would say whether they apply."]  # fmt: skip


def _failure_sentences(diagnosis) -> list[str]:
    """What the traceback says without a layout: who found what, where; the schedule and check its frames show."""
    traceback = diagnosis.traceback
    if traceback is None:
        return []
    failure, evidence = traceback.failure, traceback.evidence
    parts = []
    if failure is not None and failure.signal is not None:
        seen = traceback.nonfinite
        parts.append(
            signal_sentence(failure, seen.counts.get(failure.signal.id, 1), seen.same_stamp(failure.signal.id))
        )
        parts += [said] if (said := earlier_sentence(failure, seen)) is not None else []
        parts += [said] if (said := forward_sentence(traceback)) is not None else []
        if traceback.error is not None and not failure.signal.fatal:  # a warning, then another error ended the run
            parts.append(f"The run then ended on an error that names no NaN or Inf: {_ended(traceback.error)}")
    elif failure is not None and failure.format != "rerun":
        who = f"Rank {failure.rank}" if failure.rank is not None else "A rank (the text does not say which)"
        where = [f"on node {failure.node}" if failure.node else "", f"device {failure.device}" if failure.device is not None else ""]  # fmt: skip
        where_text = ", ".join(part for part in where if part)
        parts.append(f"{who} {_what_it_found(failure)}" + (f", {where_text}." if where_text else "."))
    elif failure is not None:
        parts.append(f"Rank {failure.rank} (node {failure.node}, device {failure.device}) had a result rejected.")
    elif traceback.frames or traceback.code:
        rank = traceback.prefix_rank
        said = f" (rank {rank}'s: its lines' [rank{rank}]: prefixes)" if rank is not None else ""
        if traceback.error is not None:
            parts.append(f"The traceback{said} ends in an error that names no NaN or Inf: {_ended(traceback.error)}")
        else:
            parts.append(f"The traceback{said} ends before its error line: only its frames say what happened.")
        metrics = traceback.nonfinite.metrics
        if metrics.bar is not None and metrics.first is None:  # where the run was when it failed
            parts.append(f"The last progress bar in the text shows step {metrics.bar} done (line {metrics.bar_line}).")
        if traceback.interleaved:
            parts.append("The frames of several processes interleave in it (lines glued mid-line): each is read once.")
        if (reached := traceback.reaches()) is not None:
            what, frame = reached
            parts.append(f"Its frames reach {what} ({frame.path.replace(chr(92), '/').rsplit('/', 1)[-1]}:"
                         f"{frame.line} {frame.function}).")  # fmt: skip
        parts += code_sentences(traceback)  # what is left of frames whose `File "` lines were lost
    elif read_metric_lines(traceback):
        parts.append("No error line in the log names a NaN or an Inf: only its metric lines say what happened.")
    else:
        parts.append("No error line in the log names a NaN or an Inf, and it has no metric line.")
    other = failure.rank if failure is not None and failure.rank is not None else traceback.prefix_rank
    parts += [said] if (said := traceback.elastic.sentence(other)) is not None else []
    zeroed = traceback.metrics.zeroed  # said after the first non-finite metric (_metric_sentences)
    parts += [f"Its {excursion.text()}." for excursion in traceback.excursions() if excursion is not zeroed]
    if evidence.schedule is not None or evidence.check is not None:
        shown = [line for line in evidence.lines if not line.startswith("the innermost")]
        parts.append("The frames show " + "; ".join(shown) + ".")
    return parts


def _framework_sentence(diagnosis) -> str:
    framework = diagnosis.framework
    if framework.name == "unknown":
        traceback = diagnosis.traceback
        read = [] if diagnosis.script is None else ["the launch script"]
        if traceback is not None:
            read.append("the traceback" if traceback.frames else "the log")
        if framework.how.startswith(UNCATALOGUED):  # the libraries it shows (launch.libraries)
            libraries = framework.how.split("; ", 1)[1]
            return f"{UNCATALOGUED.capitalize()} is named ({libraries}), so no framework's own causes are weighed."
        core = framework.how.split("; megatron-core runs it: ", 1)[1:]
        core = f"; megatron-core runs the job ({core[0]})" if core else ""
        return (
            f"Nothing in {' or '.join(read) or 'the input'} names a framework nanscope catalogues{core}, so no "
            "framework's own causes are weighed."
        )
    release = f" {framework.release}" if framework.release else ""
    return f"The job is {_owner(framework.name + release)} ({balanced(framework.how)})."


def _owner(name: str) -> str:
    """`name`'s, or `name`' where it ends in s (transformers')."""
    return name + ("'" if name.endswith("s") else "'s")


def _rank_sentences(diagnosis) -> list[str]:
    """Where the failing (or asked-for) rank sits and what it reported."""
    rank, layout, traceback = diagnosis.failing, diagnosis.topology, diagnosis.traceback
    failure = traceback.failure if traceback is not None else None
    reported = failure is not None and failure.rank == rank.rank
    if reported:
        device = failure.device if failure.device is not None else rank.local_device
        node = (
            f"node {failure.node} (node index {rank.node_index})" if failure.node else f"node index {rank.node_index}"
        )
        where = f"on {node}, device {device}"
        what = f" {_what_it_found(failure)}, {where}."
    else:
        what = f" is on node index {rank.node_index}, local device {rank.local_device}."
        if failure is not None and failure.rank is not None:
            what += f" (The traceback's failing rank is {failure.rank}.)"
    last = rank.pp == layout.pp - 1
    stage = "the last pipeline stage" if last else f"pipeline stage {rank.pp} of {layout.pp}"
    layers = ""
    if rank.layers is not None:
        layers = ", " + (f"decoder layers {span(rank.layers)}" if rank.layers else "no decoder layers")
        layers += " plus the final norm and output layer" if rank.holds_output_layer else ""
    parts = [f"Rank {rank.rank}{what}", _coordinates(diagnosis, f"{stage}{layers}")]
    if last and layout.pp > 1 and reported:
        check, kind = failure.check, failure.kind
        the = "At that world the" if diagnosis.inferred else "The"  # its stage holds only at the inferred world
        if check is not None and check.quantity == "loss":
            parts.append(
                f"{the} last stage computes the loss, so its check reports a value that can have started in any layer."
            )
        elif check is not None or kind in ("NaN", "Inf"):
            value = "large gradient" if kind == "large" else kind
            parts.append(
                f"{the} last stage holds the loss and checks its gradients first in 1F1B, so the "
                f"{value} can have started in any layer."
            )
    return parts


def _coordinates(diagnosis, stage: str) -> str:
    """The failing rank's coordinates; where the world is inferred (the least the input allows), those before DP in
    the layout's order hold at any world (a rank's digits faster than DP's: tp, cp, ep in tp-cp-ep-dp-pp), DP and
    those after it only at that world."""
    rank, layout = diagnosis.failing, diagnosis.topology
    said = {"tp": f"TP {rank.tp}", "cp": f"CP {rank.cp}", "dp": f"DP {rank.dp}", "pp": f"PP {rank.pp}"}
    if not diagnosis.inferred:
        return f"It is {' / '.join(said.values())} (EP {rank.ep}): {stage}."
    order = [dim for dim in layout.order.split("-") if dim in said]
    fixed = order[: order.index("dp")] if "dp" in order else order
    moving = [said[dim] for dim in order if dim not in fixed]
    return (f"It is {' / '.join(said[dim] for dim in fixed)} (EP {rank.ep}) at any world size; at world "
            f"{layout.world}, the least the input allows (inferred, see the layout), it is {' / '.join(moving)}: "
            f"{stage} (a larger world moves those).")  # fmt: skip


def _iteration_sentence(failure, summary) -> list[str]:
    """The iteration Megatron's error line names (>= 0), else the one its iteration line before it logged done."""
    if failure.iteration is not None and failure.iteration >= 0:
        return [f"The error line names iteration {failure.iteration}."]
    if summary.after_step is not None:
        return [f"The error came after iteration {summary.after_step}: {summary.after_from}."]
    return []


def _commands_sentence(script) -> str:
    """A script of several commands that run a Python script or module (launch.script.LaunchScript.earlier): the
    last is read as the run."""
    met = sorted({*script.earlier, (script.line, script.train_script)})
    if len(met) == 1:  # one command met twice (a function called twice)
        return f"The launch script runs its command at line {script.line} more than once."
    shown = ", ".join(f"line {line}: {name}" for line, name in met[:6]) + (", ..." if len(met) > 6 else "")
    return (f"The launch script runs {len(met)} Python scripts or modules ({shown}): the last met, line "
            f"{script.line}, is read as the run's command.")  # fmt: skip


def _what_it_found(failure) -> str:
    """What the failing rank's check found, in the words of its message."""
    check, bucket = failure.check, f" (bucket #{failure.bucket})" if failure.bucket is not None else ""
    if failure.signal is not None:
        return signal_sentence(failure).rstrip(".")
    if check is not None and check.id == "clip-grad-norm-nan":
        return "found NaN in its local gradient norm in clip_grads (the optimizer step, Megatron-LM core 0.4/0.5)"
    if check is not None and check.id == "grad-norm-nan" and failure.format == "assert":
        whose = "core 0.6 to 0.9's assertion" if not failure.unreleased else "grad_buffer.py's assertion, in no release"
        return f"found NaN in its local gradient norm before the data-parallel reduce ({whose})"
    if not failure.message:
        return f"had a check reject the result {failure.result}" if failure.result else "had a check reject a result"
    nonfinite_norm = failure.kind in ("NaN", "Inf") and "grad norm" in failure.message  # a message cut or reworded
    if (check is None and nonfinite_norm) or (
        check is not None and check.quantity == "gradient" and check.value != "large"
    ):
        return f"found {failure.kind} in its local gradient norm{bucket} before the data-parallel reduce"
    if check is None:
        return f"had a check reject the result {failure.result} (message '{failure.message}')"
    if check.quantity == "gradient":
        return (
            f"found an unexpectedly large gradient norm{bucket}, {failure.result}: finite, not NaN or Inf, but at "
            "least 10 times the largest of its first 100 checks (--check-for-large-grads), before the data-parallel "
            "reduce"
        )
    if check.value == "large":
        return (
            f"found a spiky loss, {failure.result}: at least 10 times the largest of its first 100 "
            "(--check-for-spiky-loss)"
        )
    return f"found {check.value} in its local forward loss (Megatron-LM's loss_func)"


def _why_it_died(failure, config) -> list[str]:
    """Why the job died of this check (or, for Megatron-LM's checks, whose job it was)."""
    check = failure.check
    if config is None:
        return _why_without_flags(failure)
    if check is not None and not check.slime:
        return [
            f"The job was not slime's: this check is Megatron-LM's ({check.source}), in Megatron-LM's own "
            "training loop, which slime never runs (slime computes its loss in its own loss function)."
        ]
    if check is not None and check.value == "large":
        return [
            "The job died (instead of skipping the step) because --check-for-large-grads is on and slime runs "
            "Megatron's rerun state machine disabled, where even this non-fatal check raises."
        ]
    if config["check_for_nan_in_loss_and_grad"]:
        return [
            "The job died (instead of skipping the step) because --check-for-nan-in-loss-and-grad is on "
            "and slime runs Megatron's rerun state machine disabled."
        ]
    return []


def _why_without_flags(failure) -> list[str]:
    """What the form of the error line says about the job's end (no flags to read)."""
    if failure.format == "raise":
        return [
            "The job died (instead of skipping the step) because megatron-core's RerunStateMachine ran disabled, "
            "where a rejected result raises (core 0.12 on)."
        ]
    if failure.format == "assert":
        return ["The job died of Megatron's assertion (core 0.4 to 0.9, before the RerunStateMachine)."]
    if failure.format in ("log-at-file", "log-on-rank"):
        return ["The RerunStateMachine was enabled: it logged the result and reran the step to tell a fault from "
                "the computation."]  # fmt: skip
    return []


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
    model are never decided by flags, so at least two always do, unless the traceback's check rules them out:
    then one, or none, may be left)."""
    left = remaining(candidates)
    if not left:
        return "No catalogued cause fits: each is ruled out below, by the flags or by what the traceback's check says."
    groups = [(ENABLED, "enabled by these flags"), (UNDECIDABLE, "not decidable from flags")]
    said = "; ".join(
        f"{', '.join(candidate.id for candidate in left if candidate.status == status)} {words}"
        for status, words in groups
        if any(candidate.status == status for candidate in left)
    )
    if len(left) == 1:
        return (
            f"1 catalogued cause remains ({said}); the flags alone do not say whether it fired: the candidate "
            "below names the one observation that tells it."
        )
    return (
        f"{len(left)} catalogued causes remain ({said}), so the flags alone do not say which one fired: "
        "each candidate below names the one observation that tells it apart."
    )
