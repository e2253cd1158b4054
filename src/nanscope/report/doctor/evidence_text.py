"""The words every doctor renderer uses for evidence other than Megatron's error line: another stack's evidence line
(facts.signals), the first non-finite metric line, the skip counters, the ranks left waiting.

    signal_sentence(failure)      "DeepSpeed's fp16 loss scaler skipped a step on inf or NaN gradients (line 3: ...)."
    first_sentence(summary)       "The first non-finite value: critic/vf_loss (the critic) at step 1 ...: it points to ..."
    evidence_lines(traceback)     the lines of the error section
"""

from __future__ import annotations

from nanscope.launch import native_errors
from nanscope.launch.anomaly import DISPATCH_SOURCE, OPERATOR_SOURCE, SOURCE
from nanscope.launch.code_lines import pointed, whose
from nanscope.launch.line_steps import AT_OR_AFTER, AT_OR_BEFORE, bar_words
from nanscope.launch.nonfinite import AFTER_IT
from nanscope.launch.readings import COUNTERS
from nanscope.launch.summary import Summary

_WHO = {
    "deepspeed-overflow": "DeepSpeed's fp16 loss scaler skipped a step on inf or NaN gradients",
    "loss-scale-minimum": "DeepSpeed's fp16 loss scale reached its minimum with the gradients still overflowing, and "
    "the run ended",
    "anomaly-nan": "autograd's anomaly mode found a backward function returning non-finite values",
    "anomaly-forward": "autograd's anomaly mode traced the forward call of a backward function that failed",
    "probability-assert": "sampling (torch.multinomial) was given probabilities holding inf, NaN or a negative value",
    "bad-probs": "the sampler's guard found the sampling probabilities non-finite (the policy's logits at rollout)",
    "none-logprob": "TRL's trainer met a None among a completion's sampling log-probs, its writing of vLLM's NaN "
    "log-prob",
    "device-assert": "a CUDA device-side assert fired",
    "nccl-timeout": "a collective timed out (NCCL's watchdog)",
    "skip-nonfinite-grad": "the framework skipped an optimizer step on a non-finite gradient norm",
    "scaler-overflow": "a dynamic loss scaler skipped a step on inf or NaN gradients",
    "logged-nonfinite": "TensorBoard's writer was given a NaN or Inf scalar",
    "nonfinite-error": "the run ended on an error naming NaN or Inf",
    "nonfinite-message": "the log says a loss or a gradient went NaN or Inf",
    "printed-tensor": "a printed tensor holds NaN or Inf",
    "unnamed-values": "a logged row of values no name labels holds NaN or Inf",
    "out-of-memory": "the run ran out of GPU memory (torch's CUDA allocator)",
}
MODEL_WORDS = {"actor": "the actor", "critic": "the critic, the value model", "policy": "the policy",
           "reference": "the reference model", "reward model": "the reward model", "reward": "the reward"}  # fmt: skip


def balanced(text: str) -> str:
    """`text` quoted from an input, cut before a bracket it opens and never closes (a line cut short): a sentence
    that quotes it stays whole."""
    depth, cut = [], len(text)
    for i, char in enumerate(text):
        if char in "([{":
            depth.append(i)
        elif char in ")]}":
            if not depth:
                return text[:i].rstrip(" ,;:")
            depth.pop()
    if depth:
        cut = depth[0]
    return text[:cut].rstrip(" ,;:") + ("..." if cut < len(text) else "")


def _head(failure) -> str:
    """Who did what, by the evidence line's words (whose they are, where facts.signals.WORDINGS knows)."""
    signal, wording = failure.signal, failure.printed_by
    if signal.id == "deepspeed-overflow" and wording is not None and len(wording.stacks) > 1:
        return "An fp16 loss scaler skipped a step on inf or NaN gradients"
    if signal.id == "skip-nonfinite-grad" and wording is not None:
        return f"{_capital(wording.printed_by)} skipped an optimizer step on a non-finite gradient norm"
    if signal.id in ("deepspeed-overflow", "scaler-overflow") and wording is not None and len(wording.stacks) == 1:
        return f"{_capital(wording.printed_by)} skipped a step on inf or NaN gradients"
    if signal.id == "nonfinite-message" and (failure.op or "").endswith("Warning"):  # its words say what, not loss
        return f"A {failure.op} says a value went NaN or Inf"
    if signal.id == "nonfinite-message" and (failure.op or "").lower().endswith("=true"):  # a check's own flag
        return "A check's flag says a value it checked held NaN or Inf"
    return _capital(_WHO.get(signal.id, signal.means))


def _capital(text: str) -> str:
    """A sentence's start, capitalised; a project's own lower-case name (verl, apex) kept."""
    return text if text.split(" ", 1)[0].split("'", 1)[0] in _LOWER_NAMES else text[0].upper() + text[1:]


_LOWER_NAMES = ("verl", "apex", "fairseq", "autograd", "torch")
_NAMES = ("Megatron", "Python", "Lightning", "Ray", "JAX", "Keras")  # a name with one capital: kept mid-sentence


def _mid(text: str) -> str:
    """A sentence's start, put after a clause (`On rank 0, ...`): lower-cased, a name (DeepSpeed, CUDA, Megatron)
    kept."""
    word = text.split(" ", 1)[0].split("'", 1)[0]
    return text if any(c.isupper() for c in word[1:]) or word in _NAMES else text[0].lower() + text[1:]


def signal_sentence(failure, count: int = 1, stamp=None) -> str:
    """One sentence: what the evidence line says (`count`: lines of its kind in the log; `stamp`: the one time stamp
    and message they all repeat, launch.stamps.Stamped), where, rank and step."""
    signal = failure.signal
    said = [f"line {failure.line}" + (f", and {count - 1} more such line(s)" if count > 1 else "")]
    if stamp is not None:
        said[0] += f", all at one time stamp, {stamp.stamp}: several processes at once"
        if len(stamp.ranks) > 1:
            ranks = ", ".join(map(str, stamp.ranks[:-1])) + f" and {stamp.ranks[-1]}"
            said[0] += f" (ranks {ranks} of {stamp.world}, as their `(rank/world)` prefixes say)"
    if failure.op:
        said.append(f"{failure.op}" + (f", output {failure.output}" if failure.output is not None else ""))
    if failure.detail and failure.detail != failure.op and not failure.detail.startswith(failure.op or "\0"):
        said.append(balanced(failure.detail))
    deepspeed = failure.printed_by is None or failure.printed_by.stacks == ("deepspeed",)
    if signal.id == "deepspeed-overflow" and failure.rank is None and failure.ranks and deepspeed:
        said.append(failure.ranks[0])  # the rank that logs it: every rank skips the step
    head = _head(failure)
    if (
        failure.printed_by is not None
        and len(failure.printed_by.stacks) > 1
        and failure.printed_by.printed_by not in head
    ):
        said.append(f"{failure.printed_by.printed_by}")
    if failure.rank is not None:
        head = f"On rank {failure.rank}, {_mid(head)}"
    step = ""
    if failure.step is not None:
        how = failure.step_from
        step = f" at step {failure.step}" + (f" ({how})" if how and not how.startswith("the line") else "")
        if signal.fatal and how and how.startswith(AFTER_IT):  # the lines after a run's end are of its last step
            step = f" at or after step {failure.step} ({how}: a run ends after its last step's lines)"
    sentence = f"{head}{step} ({'; '.join(said)})."
    if signal.id == "nccl-timeout":
        sentence += " The ranks its lines name waited; the one that failed is not in them."
    return sentence


def earlier_sentence(failure, seen) -> str | None:
    """A line saying a value went NaN before the fatal evidence line (`grad_norm was NaN!`, then a CUDA assert): the
    first evidence, said ahead of the error it led to (None: no such line)."""
    if failure.signal is None or not failure.signal.fatal or failure.line is None:
        return None
    said = [hit for hit in seen.first.values() if hit.signal.id == "nonfinite-message" and hit.line < failure.line]
    if not said:
        return None
    hit = min(said, key=lambda hit: hit.line)
    step = f" at step {hit.step}" if hit.step is not None else ""
    return (
        f"Before it, line {hit.line} says {balanced(hit.detail or hit.text)}{step}: the first evidence of a "
        "non-finite value; the error after it may follow from it."
    )


_SCALE_CHECKS = ("loss-scale-fall", "loss-scale-collapsed")  # said by the printed scale's own sentence (verdict)


def first_sentence(summary: Summary, weak: bool = False, counters=()) -> str | None:
    """The first non-finite metric, its model and step, and what it points to (None: no metric line says one;
    `counters`: the skip counters that rose, launch.readings.Counter)."""
    if summary.metric is None or summary.check in _SCALE_CHECKS:
        return None
    model = f" ({MODEL_WORDS.get(summary.model, summary.model)})" if summary.model else ""
    epoch = f"; epoch {summary.epoch}" if summary.epoch is not None else ""
    step = f" at step {summary.step}" if summary.step is not None else f" (the line names no step{epoch})"
    where = f" (line {summary.lines['metric']})" if "metric" in summary.lines else ""
    rounded = f"the step printed rounded: about {summary.step}" if summary.step_printed is not None else ""
    if rounded:  # `1.53e+05`: said as printed
        step, where = f" at step {summary.step_printed}", f" ({', '.join(filter(None, [where.strip(' ()'), rounded]))})"
    if weak:
        at = f"of step {summary.step} " if summary.step is not None else ""
        return (f"The only sign in the metric lines: the iteration line {at}{where.strip()} prints no {summary.metric}. "
                "Megatron prints an average loss only when it is > 0, so it was NaN, <= 0, or every iteration of the "
                "interval was skipped: weak evidence alone.")  # fmt: skip
    counter = summary.check == "skip-counter" or summary.metric.lower().rsplit("/", 1)[-1] in COUNTERS
    if counter and summary.lines.get("metric") != summary.lines.get("check"):
        # the summary's step is the evidence line's: the counter's only where it follows that line (holdout19 06: a
        # counter at line 17, step 1, and the overflow at step 2499, line 30)
        after = summary.lines.get("metric", 0) > summary.lines.get("check", 0)
        kept = next((c for c in counters if c.key == summary.metric and c.line == summary.lines.get("metric")), None)
        own = step  # the evidence line's step, else the counter's line's own
        if kept is not None and (kept.step is not None or kept.named is not None):
            own = f" at step {kept.step}" if kept.step is not None else f" {kept.value} by step {kept.named}"
        rise = kept.rise() if kept is not None else ""
        return (f"A skip counter rose: {summary.metric}{own if after else ''}{where}{rise}. What it points to: "
                f"{summary.points_to}.")  # fmt: skip
    if summary.contradicted is not None:
        return (f"The only non-finite value is a progress bar's running mean: {summary.metric}{where}, while "
                f"{summary.contradicted} on the same line are finite: not a NaN failure by itself.")  # fmt: skip
    line = summary.lines.get("metric")
    bar = bar_words(summary.step_how)
    if summary.step_bound == AT_OR_BEFORE and bar is None:  # the text starts there
        step = f" at or before step {summary.step_printed or summary.step}"
        first = "the input's first line" if line == 1 else f"the input's first record of {summary.metric}"
        where = (
            f" (line {line}: {first}, so an earlier step may have been non-finite too{'; ' * bool(rounded)}{rounded})"
        )
    elif summary.step_bound in (AT_OR_BEFORE, AT_OR_AFTER) and bar is not None:  # a bar's count: the steps done
        step, where = f" {summary.step_bound} step {summary.step_printed or summary.step}", f" (line {line}: {bar})"
    points = f" What it points to: {summary.points_to}." if summary.points_to else ""
    also = ""
    if summary.also:  # one record prints them at once: no order among them
        shown = ", ".join(summary.also[:4]) + (f" and {len(summary.also) - 4} more" if len(summary.also) > 4 else "")
        also = f", with {shown} non-finite in the same record too (which went first the record does not say)"
    return f"The first non-finite metric: {summary.metric}{model}{step}{where}{also}.{points}"


def forward_sentence(traceback) -> str | None:
    """The forward call autograd's anomaly mode printed before its error (launch.anomaly): its last frame, the file,
    line, function and code line as pasted; None: no such frames."""
    if not traceback.forward:
        return None
    frame, hit = traceback.forward[-1], traceback.nonfinite.first.get("anomaly-forward")
    op = hit.op if hit is not None and hit.op else "the failing backward function"
    at = f" (line {hit.line})" if hit is not None else ""
    where = _where(frame)
    if traceback.forward_short is not None:
        said = _short_of_op(where, *traceback.forward_short)
    elif traceback.forward_cut:
        said = (f"its last frame shown is {where}: the forward op runs within that call (the paste leaves lines out "
                "after it, so the op's own call may be a frame further in)")  # fmt: skip
    else:
        said = f"its last frame, {where}, is where the forward op was called"
    return f"Anomaly mode traced the forward call of {op}{at}: {said}; it prints that stack outermost first ({SOURCE})."


def _where(frame) -> str:
    return f"{frame.path}:{frame.line} {frame.function}" + (f", `{frame.code}`" if frame.code else "")


def _short_of_op(where: str, why: str, through) -> str:
    """The forward call's frames end before the op's own call (launch.anomaly.short_of_op): why, and the last frame
    outside torch, the call the op was reached through."""
    if why == "operator":
        said = (
            f"its last frame, {where}, is torch's wrapper of a Tensor operator, which calls the op ({OPERATOR_SOURCE})"
        )
        return said + (f"; the last frame outside torch, {_where(through)}, is the expression that used it"
                       if through is not None else "")  # fmt: skip
    said = f"the paste ends before the op's own call: its last whole frame is {where}"
    if "dispatch" in why:
        said += f", torch's module dispatch, which calls a module's forward, never an op ({DISPATCH_SOURCE})"
    if "cut" in why:
        said += ", and the frames after it are cut mid-frame"
    if through is not None:
        said += f"; the last frame outside torch, {_where(through)}, is the call it came through"
    return said


def code_sentences(traceback) -> list[str]:
    """What the known code lines of a traceback without its error line say (launch.code_lines): whose frames they
    are, and what the last one's call points to, where its call raises one error alone."""
    hits = traceback.code
    if not hits:
        return []
    groups: dict[str, list[str]] = {}
    for hit in hits:
        groups.setdefault(hit.code.library if hit.owned else whose(hit), []).append(f"`{balanced(hit.code.text)}`")
    named = [f"{who} ({', '.join(texts)})" for who, texts in groups.items()]
    listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    parts = [f"Its code lines are frames of {listed} (the releases they were read at: under what the frames show)."]
    found = pointed(hits)
    if found is not None:
        hit, signal = found
        parts.append(f"Its last known code line, `{hit.code.text}`, is {hit.code.library}'s: {hit.code.does}; "
                     f"{hit.code.raises} ({signal.source}): what the frames point to, their error line cut.")  # fmt: skip
    return parts


def evidence_lines(traceback) -> list[str]:
    """The error section's lines about evidence other than Megatron's (each traceable to a line of the input)."""
    out, failure, seen = [], traceback.failure, traceback.nonfinite
    if failure is not None and failure.signal is not None:
        signal = failure.signal
        out.append(f"evidence: {signal.id} ({signal.stack}), line {failure.line}: {failure.text}")
        out.append(f"it means: {signal.means}" + (f" [{signal.source}]" if signal.source else ""))
        out += [f"rank named: {said}" for said in failure.ranks]
    for key, hit in seen.first.items():
        if failure is None or hit.line != failure.line:
            count = seen.counts[key]
            out.append(f"also: {key} at line {hit.line}" + (f" ({count} lines)" if count > 1 else "") + f": {hit.text}")
    if (stale := seen.norms.sentence()) is not None:
        out.append(stale)
    if seen.waiting:
        out.append(f"ranks left waiting in a collective: {', '.join(map(str, seen.waiting))} (not the failing rank)")
    reading = seen.metrics.first
    if reading is not None:
        shown = ", ".join(f"{key} {value}" for key, value in reading.values[:8])
        epoch = f" (epoch {reading.said_epoch})" if reading.said_epoch is not None else ""
        step = f"step {reading.step} ({reading.step_from})" if reading.step is not None else f"no step named{epoch}"
        said, bar = seen.first_bound(), bar_words(reading.step_from)
        if said == AT_OR_BEFORE and bar is None:
            step = f"at or before {step}; the input's first record of it, so an earlier step may have been too"
        elif said in (AT_OR_BEFORE, AT_OR_AFTER):
            drawn = reading.step_from.partition(", ")[2]  # the bar after, as shown
            step = f"{said} step {reading.step} ({bar}{f': {drawn}' if drawn else ''})"
        after = f", after step {reading.after}" if reading.after is not None else ""
        out.append(f"first non-finite metric line {reading.line}, {step}{after}: {shown}")
        if len(reading.ranks) > 1:
            out.append(f"logged by rank {reading.ranks[0]}, and at the same step by rank(s) "
                       f"{', '.join(map(str, reading.ranks[1:]))} (each line names its rank)")  # fmt: skip
        elif reading.ranks:
            out.append(f"logged by rank {reading.ranks[0]} (its line names it)")
        if seen.metrics.later:
            out.append(f"{seen.metrics.later} later metric line(s) hold non-finite values too")
        if seen.metrics.episodes.again is not None:
            out.append(seen.metrics.episodes.again.sentence(reading.step))
    if (said := tracebacks_line(traceback)) is not None:
        out.append(said)
    for line, text in traceback.native:  # a native library's diagnostic: no NaN named, maybe what made one
        what = native_errors.meaning(text)
        shown = text if len(text) <= 300 else text[:300] + " ..."
        out.append(f"native error line {line} (it names no NaN or Inf): {shown}" + (f"; {what}" if what else ""))
    for counter in seen.metrics.counters:
        step = f" at step {counter.step}" if counter.step is not None else ""
        kind = "cumulative" if counter.cumulative else "over the logging interval"
        out.append(f"skip counter: {counter.key} {counter.value}{step} (line {counter.line}, {kind}){counter.rise()}")
    return out


def tracebacks_line(traceback) -> str | None:
    """Several tracebacks in one input: which one is read, and what the others may be (None: one or none)."""
    count, lines = traceback.tracebacks
    if count < 2:
        return None
    failure = traceback.failure
    read = "the one whose error line is read" if failure is not None else "the last one"
    if failure is not None and failure.line is not None:
        read = f"the one whose error line is line {failure.line}"
    shown = ", ".join(map(str, lines)) + (", ..." if count > len(lines) else "")
    return (f"{count} tracebacks in the input (starting at lines {shown}): {read} is read; each other one may be "
            "another rank's, the same failure again (after a restart or a resume) or a different error, which only "
            "its own error line says")  # fmt: skip
