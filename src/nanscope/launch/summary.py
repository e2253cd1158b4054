"""What a NaN report's text alone supports, in one record: the failing rank, the kind, the check (or evidence line)
that fired, the step, which model and which metric went non-finite first, the operation, and what that points to.

Each field is traced to a line of the input (`lines`) or is None; the record is the JSON `summary` and the first
sentence of the verdict. The model comes from the first non-finite metric line's keys (launch.metric_lines), else
from the frames of the step that failed (a rollout's generation is the policy's, a critic update the critic's).

    summary = summarize(traceback)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.launch.code_lines import points_to
from nanscope.launch.failure_models import message_keys, message_model, sampling_model, step_model
from nanscope.launch.line_shapes import AVERAGE
from nanscope.launch.line_steps import bound
from nanscope.launch.nonfinite import AFTER_IT
from nanscope.launch.tf_scopes import scope_model
from nanscope.launch.totals import first_term, is_total

# a frame's function -> the model that was running (the innermost one that names one wins)
_FRAME_MODELS = {
    "update_critic": "critic", "compute_values": "critic", "update_policy": "actor", "update_actor": "actor",
    "compute_ref_log_prob": "reference", "compute_rm_score": "reward model", "_generate_and_score_completions":
    "policy", "generate_sequences": "policy", "_prepare_inputs": "policy", "compute_log_prob": "policy",
    "trainer.generate": "policy",  # an RL trainer's generate samples from the policy (TRL's PPOTrainer.generate)
}  # fmt: skip
_RANK_TAG = "[rank"


@dataclass
class Summary:
    """The report's answers (None: the text does not say).

    Attributes:
        rank: the failing rank (an error line's, a `[rankN]:` prefix's; never a logging or waiting rank).
        kind: NaN, Inf, "NaN or Inf", large, or None.
        check: Megatron's check id, or another stack's evidence id (facts.signals), or "skip-counter".
        step: the step it names (an error line's iteration when >= 0, an evidence line's, the metric line's).
        after_step: where no step is named, Megatron's iteration line before its error: the iteration done before it
            (the error came in a later one); else the step the first non-finite metric line came after (a step an
            earlier line named, a bar redrawn after an earlier dict); `after_from`: how it was read.
        model: actor, critic, policy, reference, reward model.
        metric: the first metric that went non-finite (or the counter that rose).
        op: the backward function, assert, collective or exception named.
        points_to: what it points to.
        lines: where each answer came from, field -> line of the input.
        contradicted: the finite values on the same line that contradict the non-finite one (a progress bar's
            running mean NaN beside a finite reduced loss): not a NaN failure by itself; None: nothing contradicts it.
    """

    rank: int | None = None
    kind: str | None = None
    check: str | None = None
    step: int | None = None
    step_printed: str | None = None  # the step as the metric line prints it, where rounded (`1.53e+05`)
    step_bound: str | None = None  # how `step` bounds the metric line's own (launch.line_steps.bound): at, or before
    step_how: str | None = None  # where the metric line's step came from, where `step` is its (not in the JSON)
    after_step: int | None = None
    after_from: str | None = None
    epoch: str | None = None  # the metric line's epoch, where it names no step
    model: str | None = None
    metric: str | None = None
    op: str | None = None
    points_to: str | None = None
    lines: dict[str, int] = field(default_factory=dict)
    contradicted: str | None = None  # finite values that contradict the non-finite one: no NaN failure by itself
    benign: str | None = None  # why the text shows no NaN failure (a scale calibrating, every value finite, ...)
    opening: bool = False  # the metric's line is the input's first record of it: an earlier step may have been too
    rank_from: str | None = None  # where the rank comes from, where no error line names it (torch elastic's agent)
    model_from: str | None = None  # why the model is the one an error or evidence line points to (no metric names it)
    also: tuple[str, ...] = ()  # the other metrics non-finite on the metric's record (it does not say which went first)

    def to_dict(self) -> dict:
        return {
            "rank": self.rank, "kind": self.kind, "check": self.check, "step": self.step,
            "step_printed": self.step_printed, "step_bound": self.step_bound, "after_step": self.after_step,
            "after_from": self.after_from,
            "epoch": self.epoch,
            "model": self.model,
            "metric": self.metric, "op": self.op, "points_to": self.points_to, "lines": dict(self.lines),
            "contradicted": self.contradicted, "benign": self.benign, "rank_from": self.rank_from,
            "also": list(self.also),
        }  # fmt: skip


def summarize(traceback) -> Summary:
    """The Summary of a parsed traceback or log (launch.tracebacks.Traceback)."""
    out, failure = Summary(), traceback.failure
    seen = traceback.nonfinite
    reading = seen.metrics.first
    if failure is not None:
        out.rank, out.kind, out.op = failure.rank, failure.kind, failure.op
        out.check = failure.check.id if failure.check is not None else failure.signal.id if failure.signal else None
        step = failure.step if failure.step is not None else failure.iteration
        out.step = step if step is not None and step >= 0 else None
        if failure.signal is not None and failure.signal.fatal and (failure.step_from or "").startswith(AFTER_IT):
            out.step, out.after_step, out.after_from = None, step, failure.step_from  # a run's end: at or after it
        out.lines.update(dict.fromkeys(("rank", "check"), failure.line))
        out.points_to = failure.signal.means if failure.signal is not None else None
        overflow = failure.signal is not None and failure.signal.id.endswith("overflow")
        if out.step is None and overflow and seen.scales.stepped is not None:  # a later overflow line's step
            out.step = seen.scales.stepped[0]
    if out.rank is None and traceback.prefix_rank is not None and not _waiting(failure):
        out.rank = traceback.prefix_rank  # the one rank whose traceback the log shows (a cut one's)
    agent = traceback.elastic.rank()  # torch elastic's first observed failure: where no error line names a rank
    if out.rank is None and agent is not None and not traceback.other_ranks and not _waiting(failure):
        out.rank, out.lines["rank"] = agent[0], agent[2]
        out.rank_from = f"torch elastic's agent: {agent[1]}, the process it observed fail first"
    if reading is not None:
        out.metric, out.model = first_term(reading.values) or reading.metric, reading.model
        out.also = _also(out.metric, reading.values)
        if out.kind in (None, "NaN or Inf") and (failure is None or failure.format == "signal"):
            out.kind = _kind(reading.values) or out.kind
        out.lines["metric"], out.opening = reading.line, seen.opening
        if reading.step is not None and (failure is None or failure.format == "signal"):
            soft = failure is None or not failure.signal.fatal
            logged = failure is not None and failure.signal.id == "logged-nonfinite"  # it names no scalar
            own = logged and (reading.step_from or "").startswith("the line")  # the metric's line names its step
            if out.step is None or (soft and reading.step < out.step) or own:
                out.step = reading.step  # a skip or a warning after the first non-finite value: the value's step
        out.points_to = reading.points_to if failure is None or failure.format == "signal" else out.points_to
        out.epoch = reading.said_epoch if out.step is None else None
        out.step_printed = reading.printed if out.step is not None and out.step == reading.step else None
    elif (
        failure is not None and failure.signal is not None and (hit := seen.first.get(failure.signal.id)) and hit.metric
    ):
        out.metric, out.lines["metric"] = hit.metric, hit.line
        if failure.signal.id == "nonfinite-error":  # a total first among the terms it names: its one term, or them
            said = [(key, "nan") for key in message_keys(failure.detail)]
            out.metric = first_term(said) or out.metric
            out.also = _also(out.metric, said)
    elif seen.metrics.counters:
        _counter(out, seen.metrics)
    elif failure is None and seen.metrics.scale.drop is not None and seen.metrics.scale.collapsed is None:
        _fell(out, seen.metrics.scale)
    elif failure is None and seen.metrics.scale.collapsed is not None:
        _collapsed(out, seen.metrics.scale)
    weak = seen.metrics.weak
    if weak is not None and reading is None and out.metric is None and failure is None:  # nothing stronger said it
        out.metric, out.lines["metric"] = weak.metric, weak.line
        out.step, out.points_to = weak.step, weak.points_to
    if reading is not None and reading.contradicted is not None:  # no failure: no failing step (metrics keep it)
        out.contradicted, out.step = reading.contradicted, None if failure is None else out.step
    after = seen.megatron_after
    if out.step is None and failure is not None and failure.format != "signal" and after and after[0] is not None:
        out.after_step, out.after_from = after
    elif out.step is None and reading is not None and reading.after is not None and out.metric == reading.metric:
        out.after_step, out.after_from = reading.after, f"the metric line {reading.line} follows it"
    if failure is None and out.points_to is None:  # a traceback cut before its error line: its last code line's call
        out.points_to = points_to(traceback.code)
    if out.model is None:
        out.model = _frame_model(traceback.frames)
    if out.model is None and failure is not None and (stepped := step_model(traceback.frames or traceback.forward)):
        out.model, out.model_from = stepped
    if out.model is None and failure is not None:
        _failure_model(out, failure, traceback)
    out.benign = benign(traceback, out)
    if out.step is not None:  # the metric line's own step, or an error line's
        read = reading is not None and out.step == reading.step and out.lines.get("metric") == reading.line
        out.step_how = reading.step_from if read else None
        out.step_bound = seen.first_bound() if read else bound(out.step, None, opening=False)
    return out


def _fell(out: Summary, scale) -> None:
    """The loss scale metric lines print fell, and nothing else says a value went non-finite: the steps its halvings
    skipped on inf or NaN gradients (launch.scales.PrintedScale), after the step of the line before the fall."""
    _, _, before, after = scale.drop
    out.check, out.metric, out.lines["metric"] = "loss-scale-fall", "loss scale", after[0]
    if before[1] is not None:
        out.after_step, out.after_from = (
            before[1],
            f"the loss scale its line {before[0]} prints fell by line {after[0]}",
        )
    out.points_to = (f"a dynamic loss scaler skipped at least {scale.skipped} step(s) whose gradients held inf or NaN, "
                     "lowering its scale on each")  # fmt: skip


def _also(metric: str | None, values: list[tuple[str, str]]) -> tuple[str, ...]:
    """The record's other non-finite metrics (not its running averages, nor a value it leaves out, nor the total its
    one non-finite term makes: launch.totals), in its order."""
    total = values[0][0] if values and values[0][0] != metric and is_total(values[0][0]) else None
    keys = [key for key, value in values
            if key not in (metric, total) and value != "missing" and not key.endswith(AVERAGE)]  # fmt: skip
    return tuple(dict.fromkeys(keys))


def _counter(out: Summary, metrics) -> None:
    """A skip counter that rose, and nothing else says a value went non-finite: its line, and what a scale held over
    every skipped iteration (launch.held_scale) says, else a scaler's skips."""
    counter = metrics.counters[0]
    out.metric, out.lines["metric"] = counter.key, counter.line
    out.check = out.check or "skip-counter"
    out.step = out.step if out.step is not None else counter.step
    skips = (f"the loss scaler skipped steps ({counter.key} {counter.value}): their gradients held inf or NaN (at the "
             "start of an fp16 run, its scale calibrating)")  # fmt: skip
    out.points_to = out.points_to or metrics.scale.unmoved.points_to() or skips


def _collapsed(out: Summary, scale) -> None:
    """The loss scale metric lines print is far below any start (launch.scales.PrintedScale.collapsed), and nothing
    else says a value went non-finite: the line that printed it (its step is when it was seen, not when it began)."""
    out.check, out.lines["metric"] = "loss-scale-collapsed", scale.collapsed[1][0]
    out.metric = "lg_loss_scale" if scale.log2 is not None else "loss scale"
    out.points_to = ("the gradients overflowed fp16 over and over: a dynamic loss scaler skips each step that "
                     "overflows and lowers its scale, and it is now far below any start")  # fmt: skip


def _failure_model(out: Summary, failure, traceback) -> None:
    """The model the error's own words or the run's kind point to, where no metric line or frame names one: the keys
    an error's message gives non-finite values (launch.failure_models), a sampling assert in an RL run."""
    signal = failure.signal.id if failure.signal is not None else None
    said = message_model(failure.detail) if signal == "nonfinite-error" else None
    fatal = traceback.nonfinite.fatal  # the assert that became the failure, else the first one
    sampled = fatal if fatal is not None and fatal.signal.id == "probability-assert" else None
    sampled = sampled or traceback.nonfinite.first.get("probability-assert")
    caller = sampled.caller if sampled is not None else None
    said = said or sampling_model(signal, traceback.frames, traceback.framework.name, caller)
    scoped = scope_model(failure.op) if said is None and signal in ("nonfinite-message", "nonfinite-error") else None
    if scoped is not None:
        said = scoped[0], f"the failing check's op is in the scope {scoped[1]}"
    printed = failure.printed_by
    if said is None and printed is not None and printed.model is not None:  # only one model's code prints it
        said = printed.model, f"only {printed.printed_by} prints the line's words ({printed.source})"
    if said is not None:
        out.model, out.model_from = said


def benign(traceback, out: Summary) -> str | None:
    """Why the text shows no NaN failure, in words (None: it shows one, or cannot tell): a loss scale calibrating at a
    run's start, a gradient norm non-finite on isolated steps and finite after with the loss finite (a dynamic loss
    scaler's skipped steps), a progress bar's running mean contradicted, or every value finite (a hang at most)."""
    seen, failure = traceback.nonfinite, traceback.failure
    metrics = seen.metrics
    if out.contradicted is not None:
        return f"a progress bar's running mean only, while {out.contradicted} on the same line are finite"
    soft = failure is None or (failure.format == "signal" and not failure.signal.fatal)
    if failure is not None and failure.signal is not None and failure.signal.id.endswith("overflow") and soft:
        calibrating = seen.scales.calibrating(seen.loss_step())
        if (metrics.first is None or metrics.first.contradicted) and calibrating:
            when = "at a run's start or probing a higher scale later (no line names its step; " if (
                seen.scales.stepless()) else "at the run's start ("  # fmt: skip
            return f"the fp16 loss scale calibrating {when}{calibrating}), no loss non-finite"
        probing = seen.scales.probing(seen.loss_step())
        if (metrics.first is None or metrics.first.contradicted) and probing:
            return f"the fp16 loss scale probing a higher scale mid-run ({probing}), no loss non-finite"
    first = metrics.first
    if first is not None and metrics.recovered is not None and not metrics.relapsed and soft:
        return (f"{first.metric} non-finite on isolated steps (line {first.line}) and finite again (line "
                f"{metrics.recovered}), the loss finite throughout: the pattern of a dynamic loss scaler skipping "
                "overflowing steps")  # fmt: skip
    quiet = first is None and metrics.weak is None and not metrics.counters and not (traceback.frames or traceback.code)
    watchdog = failure is not None and failure.signal is not None and failure.signal.id == "nccl-timeout"
    printed = bool(metrics.keys) or traceback.metrics.seen  # metric lines were read
    stillness = first is None and metrics.weak is None and not metrics.counters  # no value said non-finite
    if stillness and failure is None and traceback.error is not None:
        return "the traceback ends in another error, and no value the text prints is non-finite"
    if quiet and watchdog:
        return "a collective timed out (a hang or a dead rank), and no value the text prints is non-finite"
    memory = failure is not None and failure.signal is not None and failure.signal.id == "out-of-memory"
    if memory and first is None and metrics.weak is None and not metrics.counters and len(seen.first) == 1:
        return "an out-of-memory failure (CUDA out of memory), and no value the text prints is non-finite"
    # the printed loss scale says the scaler skipped step on step, or skipped steps past a run's start
    collapsed = metrics.scale.collapsed is not None or metrics.scale.past_start()
    if quiet and failure is None and (printed or traceback.lines) and not collapsed:
        return nothing_found(traceback, read_metric_lines(traceback))
    return None


def read_metric_lines(traceback) -> bool:
    """Metric lines were read: Megatron's iteration lines, or lines of at least two `key value` pairs (one word and
    a number, `epoch 3 of run-7`, is no metric line)."""
    lines = traceback.nonfinite.metrics
    said = lines.first is not None or lines.weak is not None or bool(lines.counters)
    return traceback.metrics.seen or said or len(lines.keys) >= 2


def nothing_found(traceback, printed: bool) -> str:
    """A text with no error and no non-finite value, in words: how many lines, and what of them was read (the metric
    lines of which stack, up to which step)."""
    lines = traceback.lines
    count = f"{lines} line{'s' if lines != 1 else ''}" if lines else "the text"
    if not printed:
        return f"no non-finite value and no error found in {count} (what was read: plain lines, no metric line)"
    metrics = traceback.nonfinite.metrics
    last = metrics.explicit if metrics.explicit is not None else metrics.bar  # the last step a line read named
    first = traceback.metrics.first_step  # else the first metric line's
    name = traceback.framework.name
    stack = "an unnamed stack" if name in (None, "unknown") else name
    upto = f", up to step {last}" if last is not None else f", from step {first}" if first is not None else ""
    return f"no non-finite value and no error found in {count} (what was read: the metric lines of {stack}{upto})"


def _waiting(failure) -> bool:
    """A watchdog's timeout: the ranks its lines name waited, none of them failed."""
    return failure is not None and failure.signal is not None and failure.signal.id == "nccl-timeout"


def _kind(values: list[tuple[str, str]]) -> str | None:
    words = {value.strip("'\"").lower().lstrip("+-") for _, value in values if value != "missing"}
    if not words:
        return None
    if words <= {"nan", "nan.0"}:
        return "NaN"
    if words <= {"inf", "infinity"}:
        return "Inf"
    return None if words == {"missing"} else "NaN or Inf"


def _frame_model(frames) -> str | None:
    """The model the innermost frame that names one was running (a frame's own function, or the call its line
    makes: a traceback cut inside the next frame)."""
    for frame in reversed(frames):
        if frame.function in _FRAME_MODELS:
            return _FRAME_MODELS[frame.function]
        called = next((name for name in _FRAME_MODELS if f"{name}(" in frame.code), None)
        if called is not None:
            return _FRAME_MODELS[called]
    return None


def prefix_rank(lines: list[str]) -> int | None:
    """The one rank every `[rankN]:` prefix of a traceback's lines names (None: none, or several)."""
    ranks = set()
    for line in lines:
        at = line.find(_RANK_TAG)
        while at >= 0 and len(ranks) < 2:
            end = line.find("]:", at, at + 16)
            digits = line[at + len(_RANK_TAG) : end] if end > 0 else ""
            if digits.isdigit():
                ranks.add(int(digits))
            at = line.find(_RANK_TAG, at + 1)
    return ranks.pop() if len(ranks) == 1 else None
