"""A log's NaN evidence besides Megatron's error line, block by block: the evidence lines of every stack
(launch.signals) and its metric lines (launch.metric_lines).

Only some lines are read: those with a NaN or Inf word (`nan`, `inf`, `NaN.0`, `-inf`, `infinity`, found with a
literal search in the lowered block and checked for word boundaries: `INFO` and `nanoseconds` are passed over), and
those with one of the literals that name a signal, a progress bar, Megatron's iteration line or a skip counter.
Memory is bounded: the first hit of each kind of signal, counts of the rest, the first fatal one's line and
MAX_RANKS waiting ranks.

    seen = Nonfinite()
    for start, hit in seen.block(block, lines_before): ...   # the fatal hits of this block, with where they start
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nanscope.launch import (
    blocks,
    error_words,
    glued,
    json_records,
    logger_tables,
    loop_counters,
    loop_lines,
    printed_columns,
    scaler_config,
    stale_norms,
    tf_scopes,
)
from nanscope.launch.bars import bars, step_at
from nanscope.launch.failure_models import CALL_REACH, rl_call
from nanscope.launch.line_steps import bound
from nanscope.launch.metric_lines import LOOKAHEAD, MetricLines
from nanscope.launch.scales import Scales
from nanscope.launch.signals import Hit, read_line
from nanscope.launch.stale_norms import StaleNorms
from nanscope.launch.stamps import Stamped, Stamps
from nanscope.launch.tables import is_rule
from nanscope.launch.wrapped import dict_record, record

OWN_COUNT = "the line (the optimizer's own count)"  # launch.signals: DeepSpeed's `Grad overflow on iteration N`
MAX_RANKS = 64  # waiting ranks (NCCL's watchdog) kept
# literals (lowered) of a line worth reading besides its NaN/Inf words: the evidence lines' that hold none
# (launch.signals.MARKERS less those with a NaN/Inf word), a progress bar's, Megatron's iteration line, skip counters
NEEDLES = (
    b"overflow",
    b"already at minimum",
    b"error detected in",
    b"device-side assert",
    b"probs detected",
    b"assertion `",
    b"watchdog caught",
    b"nccl operations have failed",
    b"in a row due to overflow",
    b"skipping step. attempted loss scale",
    b"parameter loss_scale",
    b"grad scale is small",  # icefall's GradScaler warnings (launch.scaler_lines.grad_scale)
    b"grad_scale is too small",
    b"loss_scale",
    b"out of memory",
    b"found invalid values",  # torch.distributions' validation error (launch.error_words)
    b"/it",
    b"it/s",
    b"consumed samples",
    b"skipped iterations",
    b"skipped=",
    b"python_anomaly_mode",
    b"--|",
    b"-- |",
    b": non-finite values ",  # nanscope's own plugins (launch.plugin_report)
    b"nanscope: warning: ",
    b"learning iteration ",  # rsl-rl's block header: the step of the loss lines under it (launch.line_shapes)
    b"not finite",  # an error or a message saying a value is not finite (SpeechBrain's check_gradients)
    b"non-finite",
    b"invalid loss",  # Keras's TerminateOnNaN (launch.said_errors)
    b"not json compliant",  # Python's json refusing a NaN or Inf (launch.said_errors.json_float)
    b"could not infer dtype of nonetype",  # TRL's NaN sampling log-prob as None (launch.said_errors.none_logprob)
    b"skipping updating the model",  # ESPnet2's skip on a non-finite grad norm (launch.signals._skipping_update)
    b"decreased lg_loss_scale to",  # guided-diffusion's fp16 trainer (launch.scaler_lines.lg_scale)
    b"train/lr-pg_",  # slime's step log (facts.frameworks.KEYS): its keys name the framework when all is finite
) + scaler_config.ANCHORS  # a loss scaler's initial scale in the run's config print (`loss_scale` finds the others)
# fmt: skip
_LOWER = range(97, 123)
_MEGATRON = ("Unexpected result", " in local grad norm", " in local forward loss", "rerun: unexpected result")
_WATCHDOG_RANK = re.compile(r"rank (\d{1,9}) waited")


_OVERFLOWS = ("deepspeed-overflow", "scaler-overflow")
CONTEXT_LINES = 4  # lines read before a candidate line, until the first non-finite metric line: their steps, keys
MAX_CONTEXTS = 64  # evidence lines of one kind whose lines before are read so (a log may hold millions)


def _line_before(block: bytes, start: int) -> bytes:
    """The line of `block` before the one at `start` (empty for the block's first: not at hand); past a traceback's
    caret line (Python 3.11 on prints `^^^^` under the failing expression), the code line it marks."""
    if start <= 0:
        return b""
    begin = block.rfind(b"\n", 0, start - 1) + 1
    line = block[begin : start - 1][-4096:]
    if begin > 0 and _CARETS.fullmatch(line) is not None:
        return block[block.rfind(b"\n", 0, begin - 1) + 1 : begin - 1][-4096:]
    return line


_CARETS = re.compile(rb"(?:\[rank\d{1,9}\]:)?[ \t]{0,400}[\^~]{1,400}[ \t\r]{0,40}")  # `[rank0]:      ^^^^^^^^`


def _before(block: bytes, start: int, count: int) -> list[bytes]:
    """Up to `count` lines of `block` before the line that starts at `start`, in order."""
    out, end = [], start - 1
    while end > 0 and len(out) < count:
        begin = block.rfind(b"\n", 0, end) + 1
        out.append(block[begin:end][:4096])
        end = begin - 1
    return out[::-1]


def _blank_since(block: bytes, start: int, count: int) -> bool:
    """One of the `count` lines before the one at `start` is blank (at most 2 looked at)."""
    return 0 < count <= 2 and any(not line.strip() for line in _before(block, start, count))


def candidate_starts(block: bytes, extra: tuple[bytes, ...] = (), *, only_extra: bool = False) -> list[int]:
    """The starts of the lines of `block` worth reading (and of those holding an `extra` literal; `only_extra`: of
    those alone), ascending. Literal searches in the lowered block, each line taken once per needle: linear in it."""
    starts, low = set(), block.lower()
    for needle in () if only_extra else (b"nan", b"inf"):
        at = low.find(needle)
        while at >= 0:
            before = low[at - 1] if at else 32
            after = low[at + 3] if at + 3 < len(low) else 32
            word = after not in _LOWER or low.startswith((b"inity", b"inite"), at + 3)
            if before not in _LOWER and word:
                starts.add(low.rfind(b"\n", 0, at) + 1)
                end = low.find(b"\n", at)
                at = -1 if end < 0 else low.find(needle, end)
            else:
                at = low.find(needle, at + 3)
    for needle in extra if only_extra else NEEDLES + extra:
        at = low.find(needle)
        while at >= 0:
            starts.add(low.rfind(b"\n", 0, at) + 1)
            end = low.find(b"\n", at)
            at = -1 if end < 0 else low.find(needle, end)
    return sorted(starts)


# lines between CUDA's `device-side assert triggered` and the kernel's own assert line naming which (Ground-R1#4,
# holdout16 04: the two lines next to each other)
ASSERT_WITHIN = 5
AFTER_IT = "the metric line after it"  # how a hit's step came from the next metric line that names one


@dataclass
class Nonfinite:
    """What a log's lines say besides Megatron's error: the signals and the metric lines.

    Attributes:
        metrics: the metric lines' first non-finite reading and counters.
        first: the first hit of each signal, by id, in the order met.
        counts: how many lines of each signal.
        fatal: the first hit that ends a run (not a watchdog's: that one follows the failure elsewhere).
        watchdog: the first watchdog timeout; `waiting`: the ranks its lines name (at most MAX_RANKS).
    """

    metrics: MetricLines = field(default_factory=MetricLines)
    first: dict[str, Hit] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    fatal: Hit | None = None
    watchdog: Hit | None = None
    waiting: list[int] = field(default_factory=list)
    norms: StaleNorms = field(default_factory=StaleNorms)  # the gradient norms logged after DeepSpeed overflows
    scales: Scales = field(default_factory=Scales)  # the loss scaler's overflow series
    unstepped: list[Hit] = field(default_factory=list)  # evidence lines waiting for the next metric line's step
    stamps: Stamps = field(default_factory=Stamps)  # several processes printing one step's line at once
    megatron_after: tuple[int | None, str | None] | None = None  # Megatron's iteration line before its first error
    # line: (the iteration done, how), (None, None) without one; None: no such error line
    last_line: int = 0  # the last metric line read (the lines before the next one are read only if not read yet)
    opening: bool = False  # the first reading is the input's first record of its metric: every line before it read,
    # one of them a record of other keys
    forward_open: bool = False  # an anomaly-mode warning's header was read and its `(Triggered internally at` end not

    def block(self, block: bytes, lines_before: int, clean) -> list[tuple[int, Hit]]:
        """Read the lines of `block` worth reading (`clean`: a raw line as a terminal shows it); the fatal hits that
        are the first of their log, with the offset of their line."""
        out, counted, lines, consumed = [], 0, lines_before, -1
        extra = stale_norms.NEEDLES if self.norms.pending is not None else ()
        watched = self.metrics.watched()  # a first reading's later lines, finite ones too
        extra += watched
        starts, index = candidate_starts(block, extra), -1
        while (index := index + 1) <= len(starts):
            if index and not watched and (watched := self.metrics.watched()):  # the first reading came: the lines
                # after it that hold its key are read too, in order (finite: a recovery, an episode, a training loss)
                after = block.find(b"\n", starts[index - 1]) + 1  # the line after the one just read
                later = candidate_starts(block[after:], watched, only_extra=True) if after else []
                starts = starts[:index] + sorted(set(starts[index:]).union(after + at for at in later))
            if index == len(starts):
                break
            start = starts[index]
            lines += block.count(b"\n", counted, start)
            counted = start
            if start <= consumed:
                continue  # a line of a wrapped record already read
            end = block.find(b"\n", start)
            end = len(block) if end < 0 else end
            text = clean(block[start:end].decode("utf-8", "replace"))
            if (initial := scaler_config.initial(text)) is not None:  # a config print: the scaler's start, no metric
                self.scales.configured(initial, lines + 1)
                continue
            if any(marker in text for marker in _MEGATRON):  # Megatron's own error and verdict lines are
                # launch.failure's and launch.rerun's; the iteration line before the first: the step it came after
                if self.megatron_after is None:
                    self.megatron_after = loop_lines.iteration_before(block, start, lines + 1, clean)
                continue
            table = logger_tables.read(block, start, lines + 1, clean) if logger_tables.row(text) else None
            if table is not None:  # a baselines logger's table: one record
                consumed, before = table.stop, self.metrics.first
                logger_tables.feed(self.metrics, table)
                self.opening = self.opening or (before is None and self.metrics.first is not None and table.first <= 2)
                continue
            previous = clean(_line_before(block, start).decode("utf-8", "replace"))
            caption = [clean(raw.decode("utf-8", "replace")) for raw in _before(block, start, 3)[:-1]]
            if is_rule(text) and self.metrics.rule(text, previous, caption):
                continue
            following = block[end + 1 : end + 301].split(b"\n", 1)[0]
            hit = read_line(text, lines + 1, previous[-300:], clean(following.decode("utf-8", "replace")))
            if hit is None:
                joined, stop, first = (
                    json_records.record(block, start, end, clean)
                    or dict_record(block, start, end, clean)
                    or record(block, start, end, clean)
                )
                consumed = stop if stop > end else consumed
                head = lines + 1 - block.count(b"\n", first, start)  # the record's first line: its context before it
                self._metric_line(block, first, joined, lines + 1, clean, head=head)
                continue
            if text[:1].isspace() and 'File "' in previous and ", line " in previous and not glued.frame_error(text):
                continue  # a traceback frame's code line (`raise ValueError("loss is nan")`): the error line says it
            error_words.place_assert(hit, text, clean(following.decode("utf-8", "replace")))
            if hit.step is None and (hit.op or "").endswith("Warning"):  # a Python warning in an RL loop's episode
                hit.step, hit.step_from = loop_lines.episode_before(block, start, hit.line, clean)
            if hit.signal.id == "probability-assert":  # the code pasted before it: an RL trainer's generation?
                code = [clean(raw.decode("utf-8", "replace")) for raw in _before(block, start, CALL_REACH)]
                hit.caller = rl_call(code)
            if hit.step is None and hit.signal.id == "skip-nonfinite-grad":  # after a phase line tagged its step
                hit.step, hit.step_from = loop_lines.tagged_before(block, start, hit.line, clean)
            column = hit.step is None and hit.signal.id == "printed-tensor"  # a loop's printed column of scalars
            if column and (found := printed_columns.column_step(block, start, hit.line, clean, text)) is not None:
                hit.step, hit.step_from = found
            if hit.signal.id in ("nonfinite-message", "nonfinite-error"):  # TF's check op on it or under it, before
                under = block[end + 1 : end + 1 + tf_scopes.WINDOW].split(b"\n", 1)[0]  # its exception's name
                hit.op = tf_scopes.check_op(text + "\n" + under.decode("utf-8", "replace")) or hit.op
            glued.place(hit, text)
            if hit.step is None and hit.signal.fatal and not hit.at and hit.line - self.metrics.bar_line > 2:
                hit.step, hit.step_from = loop_lines.step_before(block, start, hit.line, clean)
            self._signal(block, start, hit, text, clean)
            if self._keep(hit, text, _blank_since(block, start, hit.line - self.metrics.bar_line - 1)):
                out.append((start, hit))
        return out

    def _metric_line(self, block: bytes, start: int, text: str, number: int, clean, *, head: int | None = None) -> None:
        """A metric line (a record joined from lines `head` .. `number`, its first at `start`): its values
        (launch.metric_lines), and the step it gives an evidence line still without one."""
        head = number if head is None else head
        if self.metrics.first is None and head - self.last_line > 1:  # the lines before it not read yet: theirs
            self.metrics.context(_before(block, start, min(CONTEXT_LINES, head - self.last_line - 1)), clean)
        self.last_line = number
        self.norms.logged(text, number)
        named = self.metrics.explicit_line
        before = set(self.metrics.keys) if self.metrics.first is None and head <= CONTEXT_LINES + 1 else None
        self.metrics.feed(text, number)
        self._bar_after(text, number)
        first = self.metrics.first
        if first is not None and first.line == number:  # this line holds the first non-finite metric
            if before is not None:
                self.opening = bool(before) and first.metric.lower() not in before  # records before it, none of it
            self.opening = self.opening or blocks.opening(first, self.metrics.headers)
            loop_counters.rename(first, text)  # an ad hoc loop's counters, a name with spaces
            if first.step is None and first.after is None:  # a record printed a key per line: its step key before
                step, how, epoch = loop_lines.record_before(block, start, number, clean)
                first.step, first.step_from = step, how
                first.epoch = first.epoch or epoch
            lines = [clean(raw.decode("utf-8", "replace")) for raw in _before(block, start, loop_counters.BEFORE)]
            if loop_counters.fill(first, text, lines):
                self.metrics.pending = None
        if self.metrics.explicit_line != named:
            self._name_steps(number)

    def _signal(self, block: bytes, start: int, hit: Hit, text: str, clean) -> None:
        """An evidence line: a progress bar's postfix before it is a metric line too; an overflow starts the stale
        grad_norm watch and joins the scale series."""
        found = bars(text[: hit.at]) if hit.at else []
        if found and found[-1].close > 0:
            self.metrics.feed(text[: found[-1].close + 1], hit.line, bars=False)  # its bar: with the whole line, below
        if hit.signal.id in ("deepspeed-overflow", "scaler-overflow"):
            self.scales.add(hit.scale, hit.next_scale, None, hit.line, hit.text)
        if hit.step_from == OWN_COUNT:
            self._own_step(block, start, hit, clean)
        if hit.signal.id == "deepspeed-overflow":
            self.norms.overflow(
                hit.line, [clean(raw.decode("utf-8", "replace")) for raw in _before(block, start, CONTEXT_LINES)]
            )
            self.norms.ahead(block, start, hit.line, clean)
        self.metrics.bars(text, hit.line)
        self._bar_after(text, hit.line)
        if self.metrics.first is None and self.counts.get(hit.signal.id, 0) < MAX_CONTEXTS:  # the lines before it
            self.metrics.context(_before(block, start, CONTEXT_LINES), clean)

    def _bar_after(self, text: str, number: int) -> None:
        """An overflow line with no step right before this line, which holds one progress bar: that bar's count is its
        step. The scaler prints it inside the step's optimizer step, and the loop moves its bar to that step after it:
        transformers' Trainer runs DeepSpeed's engine.step in training_step's backward (4.31.0 trainer.py:1809, :2665;
        accelerate v0.21.0 utils/deepspeed.py:165-176), then adds 1 to global_step and runs on_step_end (trainer.py:
        1897-1899), where ProgressCallback updates the bar to it (trainer_callback.py:479-481); a `for ... in tqdm(...)`
        loop moves its bar when the next step begins. Several bars on the line (a terminal's redraws written at once)
        or a bar at 0 say no step: their order against the logger's lines is not the order of printing."""
        if not self.unstepped or self.metrics.bar_line != number:
            return
        hits = [hit for hit in self.unstepped if hit.line == number - 1 and hit.signal.id in _OVERFLOWS]
        found = bars(text)
        if len(hits) != 1 or hits[0].step is not None or len(found) != 1 or found[0].count == 0:
            return
        hit, bar = hits[0], found[0]
        who = "DeepSpeed" if hit.signal.id == "deepspeed-overflow" else "the loss scaler"
        hit.step = bar.count
        hit.step_from = (f"the progress bar right after it, {bar.shown()}: {who} prints it inside that step, before "
                         "the loop moves its bar to it")  # fmt: skip
        self.scales.step(hit.step, hit.line, hit.step_from)
        if self.scales.first_step is None:
            self.scales.first_step = hit.step

    def _own_step(self, block: bytes, start: int, hit: Hit, clean) -> None:
        """An overflow line that counts the optimizer's iterations (`Grad overflow on iteration 3721`): the step of
        the first metric line within LOOKAHEAD lines after it that names one is the training step it happened in
        (DeepSpeed-Chat prints `step: 1860` after the step's update; its actor and critic engines each count)."""
        end = block.find(b"\n", start)
        for ahead in range(1, LOOKAHEAD + 1):
            if end < 0:
                return
            stop = block.find(b"\n", end + 1)
            stop = len(block) if stop < 0 else stop
            raw = block[end + 1 : stop][:4096]
            if b"step" in raw.lower():
                step = self.metrics.step_named(clean(raw.decode("utf-8", "replace")))
                if step is not None and step != hit.step:
                    hit.step_from = (f"{AFTER_IT}, line {hit.line + ahead} (the optimizer's own count is "
                                     f"{hit.step}: its iterations, not the training steps)")  # fmt: skip
                    hit.step = step
                    return
            end = stop if stop < len(block) else -1

    def _name_steps(self, number: int) -> None:
        """Evidence lines without a step before a metric line that names its own: theirs (a framework prints its
        step's metrics at the step's end, after what happened in it)."""
        for hit in self.unstepped:
            own = hit.step_from == OWN_COUNT and hit.step != self.metrics.explicit
            if (hit.step is None or own) and number - hit.line <= LOOKAHEAD:
                before, how = hit.step, f"{AFTER_IT}, line {number}"
                how += (
                    f" (the optimizer's own count is {before}: its iterations, not the training steps)" if own else ""
                )
                hit.step, hit.step_from = self.metrics.explicit, how
                if hit.signal.id in ("deepspeed-overflow", "scaler-overflow") and self.scales.first_step in (
                    None,
                    before,
                ):
                    self.scales.first_step = hit.step
                if own and hit.signal.id in ("deepspeed-overflow", "scaler-overflow"):
                    self.scales.step(hit.step, hit.line, AFTER_IT)
        self.unstepped = []

    def _keep(self, hit: Hit, text: str, parted: bool = False) -> bool:
        """Count `hit` (its step from the progress bar it follows, where its line names none, and no blank line
        `parted` them: a pasted excerpt's next part); True when it is the log's first fatal one."""
        signal = hit.signal
        if signal.id == "anomaly-forward" and self._same_warning(hit):
            return False
        timeout = signal.id == "nccl-timeout"  # it fires a timeout after the step that failed: no step of its own
        logged = signal.id == "logged-nonfinite"  # it logs the step just done
        if hit.step is None and not timeout and hit.at:
            hit.step, hit.step_from = step_at(text, hit.at, logged=logged)
        bar, since = self.metrics.bar, hit.line - self.metrics.bar_line
        if hit.step is None and not timeout and bar is not None and 0 < since <= 2 and not parted:
            hit.step = bar if logged else bar + 1
            hit.step_from = (f"the progress bar {since} line(s) before it, {bar} done"
                             + ("" if logged else ": the next step"))  # fmt: skip
        own = hit.step_from == OWN_COUNT  # an optimizer's iteration: the metric lines' step, where they name one
        if (hit.step is None or own) and not timeout and len(self.unstepped) < 16:
            self.unstepped.append(hit)
        if signal.id in ("deepspeed-overflow", "scaler-overflow") and not own:  # an own count: its metric line's
            self.scales.step(hit.step, hit.line, hit.step_from)
        if signal.id in ("deepspeed-overflow", "scaler-overflow") and self.scales.count == 1:
            self.scales.first_step = hit.step
        self.counts[signal.id] = self.counts.get(signal.id, 0) + 1
        self._stamp(signal.id, text)
        self.first.setdefault(signal.id, hit)
        if signal.id == "nccl-timeout":
            self.watchdog = self.watchdog or hit
            for said in hit.ranks:
                rank = _WATCHDOG_RANK.search(said)
                if rank is not None and int(rank[1]) not in self.waiting and len(self.waiting) < MAX_RANKS:
                    self.waiting.append(int(rank[1]))
            return False
        if signal.fatal and self.fatal is None:
            self.fatal = hit
            return True
        if signal.id == "probability-assert" and self.fatal is not None and self.fatal.signal.id == "device-assert":
            if hit.line - self.fatal.line <= ASSERT_WITHIN:  # the assert that fired, right by the CUDA error it raised
                if hit.rank is None:
                    hit.rank, hit.rank_from = self.fatal.rank, self.fatal.rank_from
                self.fatal = hit
        return False

    def _same_warning(self, hit: Hit) -> bool:
        """Whether `hit` is the `(Triggered internally at ...)` end of the anomaly-mode warning whose header was the
        last one read (launch.anomaly): one warning, not a second one with its header cut."""
        tail = (hit.detail or "").startswith("its header")
        same, self.forward_open = tail and self.forward_open, not tail
        return same

    def _stamp(self, signal: str, text: str) -> None:
        """Count the lines of `signal` that repeat its first line's time stamp and message (launch.stamps)."""
        self.stamps.add(signal, text, first=self.counts[signal] == 1)

    def same_stamp(self, signal: str) -> Stamped | None:
        """The time stamp and message every line of `signal` repeats, where there are several (None: not so)."""
        return self.stamps.same(signal, self.counts.get(signal, 0))

    def softest(self) -> Hit | None:
        """The first non-fatal hit (a skipped step, a warning), when nothing fatal was met."""
        soft = [hit for hit in self.first.values() if not hit.signal.fatal]
        if self.scales.collapsed() and (
            skip := self.first.get("scaler-overflow", self.first.get("deepspeed-overflow"))
        ):
            return skip  # a scale collapsed below 1: every step skipped, the lead whatever was logged before it
        return min(soft, key=lambda hit: hit.line) if soft else None

    def to_dict(self) -> dict:
        return {
            "signals": [
                {"check": hit.signal.id, "line": hit.line, "count": self.counts[key], "rank": hit.rank,
                 "step": hit.step, "step_from": hit.step_from, "op": hit.op, "detail": hit.detail, "text": hit.text,
                 "printed_by": None if hit.wording is None else list(hit.wording.stacks),
                 "source": None if hit.wording is None else hit.wording.source}
                for key, hit in self.first.items()
            ],
            "waiting_ranks": sorted(self.waiting),
            "stale_grad_norm": None if self.norms.first is None else
            {"line": self.norms.first[0], "value": self.norms.first[1], "before_overflow": self.norms.first[2]},
            "stale_grad_norms": self.norms.to_dict(),
            "loss_scale": None if self.scales.first is None else
            {"overflows": self.scales.count, "first": self.scales.first, "first_step": self.scales.first_step,
             "lowest": self.scales.lowest, "copies": self.scales.copies, "says": self.scales.sentence(self.loss_step())},
        }  # fmt: skip

    def first_bound(self) -> str | None:
        """How the first reading's step bounds its own (launch.line_steps.bound; None: no reading or no step): the
        input's first record of its metric, or its first line, is at or before it."""
        first = self.metrics.first
        if first is None:
            return None
        return bound(first.step, first.step_from, opening=self.opening or first.line == 1)

    def loss_step(self) -> int | None:
        """The step of the first non-finite loss on a metric line (what a calibrating scaler does not explain)."""
        first = self.metrics.first
        if (
            first is None
            or first.contradicted
            or not any("loss" in key.lower() for key, value in first.values if value != "missing")
        ):
            return None
        return first.step
