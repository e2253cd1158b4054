"""A dynamic loss scaler's overflow lines, as one series: where the scale started, how low it went, whether it grew
back, whether it sat at its floor. What the series says is the difference between a benign start and a failure:

    134217728 -> 67108864 -> 33554432 at steps 7, 8, 9     a scale calibrating from its initial value (2^27)
    64 -> 32 -> ... -> 2 at steps 379 .. 383                 the gradients overflow step after step, mid-run
    8192 -> 4096, then 8192 -> 4096 again                    periodic overflows, the scale oscillating
    1 -> 1                                                   the scale at its floor: every overflowing step skipped

    scales = Scales(); scales.add(hit) ...; scales.sentence(loss_step)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nanscope.launch.held_scale import HeldScale

HIGH = 65536.0  # 2^16: fp16 loss scalers start here or above (DeepSpeed's initial_scale_power 16 .. 32)
LOW = 1024.0  # a scale this low has been halved many times from any start
EARLY = 100  # steps from a run's start where halving from a high scale is the scaler calibrating


def shown(scale: float) -> str:
    """A scale as said: exact, with its power of two where it is one (`8388608 (2^23)`)."""
    return _shown(scale)


def _shown(scale: float) -> str:
    power = math.log2(scale) if scale > 0 else 0.5
    exact = f"{scale:.0f}" if scale == int(scale) else f"{scale:g}"
    return f"{exact} (2^{power:.0f})" if power == int(power) and power >= 10 else exact


_STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")  # a log prefix's time, to the second
# DeepSpeed's loss scaler prints int(scale) (deepspeedai/DeepSpeed edaa722 deepspeed/runtime/fp16/loss_scaler.py:276):
# `0, reducing to 0` is a scale below 1; older ZeRO lines print the float (`0.0, reducing to 0.0`: a floor of 0)
_INT_ZERO = re.compile(r"loss scale: 0, reducing to 0(?![.\d])")
_RANK = re.compile(r"\bRank (\d{1,7})\b")


def _copy(previous: tuple, here: tuple) -> bool:
    """`here` (line, attempted, set, time, rank) repeats the halving of the line just before it in the same second,
    or, with no time printed, from another rank: another process's print of one overflow."""
    line, scale, next_scale, stamp, rank = here
    if previous[:3] != (line - 1, scale, next_scale) or scale is None or next_scale is None or next_scale >= scale:
        return False
    if rank is not None and rank == previous[4]:  # one rank twice: two overflows (DeepSpeed's rank-0-only line)
        return False
    if stamp is not None or previous[3] is not None:
        return stamp == previous[3]
    return rank is not None and previous[4] is not None


@dataclass
class Scales:
    """The overflow lines' scales, in order (bounded: a few numbers, whatever the log's length)."""

    count: int = 0
    first: float | None = None  # the first attempted scale
    first_step: int | None = None
    lowest: float | None = None  # the lowest scale set
    last: float | None = None  # the last scale set
    regrew: tuple[float, float] | None = None  # (a scale set, a later attempted scale above it)
    truncated: bool = False  # a line printed int(scale) 0 -> 0: the scale below 1, not at a floor
    floor: tuple[float, float] | None = None  # an attempted scale the scaler could not lower: (attempted, set)
    halved: bool = False  # a scale was lowered
    stepped: tuple[int, int, str | None] | None = None  # the first overflow line that has a step: (step, line, how)
    last_step: int | None = None  # the last overflow line's step
    in_a_row: bool = True  # the overflow lines' steps follow one another (each the one before + 1)
    floored: int = 0  # overflow lines at the floor (attempted = set <= 1)
    first_set: float | None = None  # the first scale set, where the lines print only that (apex amp, DLLogger)
    copies: int = 0  # lines repeating the halving on the line just before: another process's print of one overflow
    previous: tuple | None = None  # the last line added: (line, attempted, set, its time to the second, its rank)
    initial: tuple[float, int, str] | None = None  # the initial scale the run's config prints: (scale, line, as said)
    held: int = 0  # overflow lines that kept a scale above its floor (the scaler's hysteresis spent)
    steps: int = 0  # the overflows whose lines name a step (a step the line before named again: the same overflow)
    gap: int | None = None  # the fewest steps between two overflows' steps

    def add(self, scale: float | None, next_scale: float | None, step: int | None, line: int | None = None,
            text: str = "") -> None:  # fmt: skip
        """One overflow line (at `line`, `text`): the scale it attempted and the one it set (None: not printed). The
        same halving on the very next line, in the same second or from another rank, is one overflow printed by
        another process (each DP rank's ZeRO optimizer prints it: holdout21 04's three ZeRO-1 lines of one second,
        holdout17 10's `Rank 6`, `Rank 4`, ...), not the scale grown back and halved again; the same rank again, or
        another time, is another overflow (DeepSpeed's loss scaler prints only on rank 0: a grep of its lines)."""
        stamp, rank = _STAMP.search(text), _RANK.search(text)
        here = (line, scale, next_scale, stamp and stamp[0], rank and rank[1])
        copy = line is not None and self.previous is not None and _copy(self.previous, here)
        self.previous = None if line is None else here
        if copy:
            self.copies += 1
            return
        self.count += 1
        if scale is not None and self.first is None:
            self.first, self.first_step = scale, step
        if scale is None and next_scale is not None and self.first_set is None:
            self.first_set = next_scale
        if scale is not None and self.last is not None and scale > self.last and self.regrew is None:
            self.regrew = (self.last, scale)
        if next_scale is not None:
            if scale is not None and next_scale < scale:
                self.halved = True
            elif scale == next_scale == 0 and _INT_ZERO.search(text):  # int(scale) printed: below 1, no floor
                self.truncated = True
            elif scale is not None and next_scale == scale and self._floor(scale):
                self.floor = self.floor or (scale, next_scale)
                self.floored += 1
            elif scale is not None and next_scale == scale:
                self.held += 1
            self.last = next_scale
            self.lowest = next_scale if self.lowest is None else min(self.lowest, next_scale)

    def configured(self, found: tuple[float, str], line: int) -> None:
        """The initial scale a config line prints (launch.scaler_config), kept before the first overflow line: the scale
        the scaler starts at (the first line that prints it: DeepSpeed's own print before the user's json)."""
        if self.count == 0 and (self.initial is None or self.initial[0] != found[0]):
            self.initial = (found[0], line, found[1])

    def step(self, step: int | None, line: int, how: str | None) -> None:
        """The step of the overflow line just added (None: it names none)."""
        if step is None:
            return
        if step != self.last_step:
            self.steps += 1
        if self.last_step is not None and step != self.last_step:
            gap = abs(step - self.last_step)
            self.gap = gap if self.gap is None else min(self.gap, gap)
        if self.stepped is None:
            self.stepped = (step, line, how)
        elif self.last_step is not None and step != self.last_step + 1:
            self.in_a_row = False
        self.last_step = step

    def _steps(self) -> str:
        """Where the overflow lines' steps come from, in words ("" where no line has one)."""
        if self.stepped is None:
            return ""
        step, line, how = self.stepped
        shown = f" ({how})" if how and not how.startswith("the line") else ""
        if self.last_step is not None and self.last_step != step and self.in_a_row:
            return f"; steps {step} to {self.last_step} in a row, the first at line {line}{shown}"
        return f"; from step {step} (line {line}{shown})"

    @staticmethod
    def _floor(scale: float) -> bool:
        return scale <= 1.0  # DeepSpeed's min_loss_scale default 1 (a spent hysteresis also keeps the scale)

    def collapsed(self) -> bool:
        """A scale set below 1 (apex amp's scaler halves with no floor: `reducing loss scale to 2.0237e-320`): halved
        on overflow after overflow far past any start, so every step overflows and is skipped."""
        return self.lowest is not None and self.lowest < 1.0

    def _set_only(self) -> str | None:
        """A series whose lines print only the scale set (the one attempted is not said): its trend."""
        if self.first_set is None or self.lowest is None:
            return None
        if not self.collapsed() and (self.count < 2 or self.lowest >= self.first_set):
            return None
        if self.collapsed():
            start = _shown(self.first_set) if self.first_set >= 1 else repr(self.first_set)  # as printed
            return (f"The loss scale the scaler set is down to {self.lowest!r} ({self.count} overflow line(s), "
                    f"from {start}), below 1: halved on overflow after overflow, far past any start: the gradients "
                    "hold inf or NaN even unscaled (an overflow, or a non-finite forward pass or weights, which no "
                    "scale helps), and each step where they do is skipped (not a scale calibrating; how many steps "
                    "still train, the run's own step counters say).")  # fmt: skip
        return (f"The loss scale the scaler set falls from {_shown(self.first_set)} to {_shown(self.lowest)} over "
                f"{self.count} overflow line(s) (the scale it attempted is not printed): steps with inf or NaN "
                "gradients keep coming, each one skipped.")  # fmt: skip

    def _start(self) -> tuple[str, str, float] | None:
        """Where the first attempted scale is a scaler's start: (in words, its series in words, the lowest scale a
        calibration halves to from it); None: not a start. The initial scale the run's config prints is one whatever
        its size (DeepSpeed's initial_scale_power 8 starts at 256: holdout23 06); a scale of 2^16 or more is where fp16
        scalers start. A calibration halves a few times: at most to LOW from HIGH, 2^6 below its start."""
        if self.initial is not None and self.first == self.initial[0]:
            scale, line, said = self.initial
            words = f"the initial scale the run's config prints (line {line}: {said})"
            return words, "its initial scale, as the run's config prints it", min(LOW, scale * LOW / HIGH)
        if self.first is not None and self.first >= HIGH:
            return "as high as fp16 loss scalers start (2^16 or more)", "a high first scale", LOW
        return None

    def calibrating(self, loss_step: int | None = None) -> str | None:
        """The series is a scale calibrating at a run's start (its first scale a start, halving not far, early), and
        no loss went non-finite: no NaN failure by itself. Its series in words (None: not so)."""
        if self.first is None or self.floor is not None or self.regrew is not None or loss_step is not None:
            return None
        lowest = self.lowest if self.lowest is not None else self.first
        still = self.last_step is not None and self.last_step > EARLY  # still falling past a run's start
        start = self._start()
        if start is None or lowest < start[2] or still or (self.first_step is not None and self.first_step > EARLY):
            return None
        return f"{start[1]}, {'halving' if self.halved else 'kept (its hysteresis spent)'}"

    def stepless(self) -> bool:
        """One overflow (its hysteresis spent first, or not) with no line naming a step, its scale not the config's
        initial one: a run's start or a probe later, the text does not say which."""
        single = self.count == 1 or self.count == 2 and bool(self.held)
        given = self.initial is not None and self.first == self.initial[0]  # the config's initial scale: a start
        return single and not given and self.first_step is None and self.last_step is None

    def probing(self, loss_step: int | None = None, finite: bool = True) -> str | None:
        """The series is a dynamic loss scaler probing a higher scale mid-run: every overflow line names its step, the
        first past a run's start, each more than EARLY steps after the one before, the scale halved and never set
        below HIGH, and no loss non-finite. A dynamic scaler doubles its scale after `scale_window` steps without an
        overflow and halves it on the next overflow (DeepSpeed 0.16.4 deepspeed/runtime/fp16/loss_scaler.py:199-202,
        :178-184; scale_window default 1000: :114, :121, runtime/constants.py:169), so a lone overflow at a high scale
        far into a run is that probe: no NaN failure by itself (`finite`: no metric line's value non-finite, whatever step
        it names). Its series in words (None: not so)."""
        if self.first is None or self.floor is not None or loss_step is not None or not self.halved or not finite:
            return None
        if self.stepped is None or self.stepped[0] <= EARLY or self.steps != self.count:
            return None
        if (self.lowest or 0.0) < HIGH or (self.gap is not None and self.gap <= EARLY):
            return None
        if self.count == 1:
            return f"one overflow at step {self.stepped[0]}, the scale halved from {_shown(self.first)} to {_shown(self.lowest)}"
        return (f"{self.count} overflows from step {self.stepped[0]}, at least {self.gap} steps apart, the scale never "
                f"below {_shown(self.lowest)}")  # fmt: skip

    def _halves(self) -> str:
        """What the scale does over the series, in words."""
        if not self.halved:
            return "is kept (the overflow spent the scaler's hysteresis)"
        if self.held:
            return f"is kept on {self.held} overflow(s) (spending the scaler's hysteresis), then halves"
        return "halves on consecutive overflows" if self.count > 1 else "halves once"

    def sentence(self, loss_step: int | None = None, finite: bool = True) -> str | None:
        """What the series says, in one or two sentences (None: no scale printed); `finite`: no metric line's value
        non-finite."""
        said = self._sentence(loss_step, finite)
        if said is None or not self.copies:
            return said
        return (
            f"{said} ({self.copies} more line(s) repeat an overflow on the line just before it: the same "
            "overflow printed by another process, each data-parallel rank's optimizer agreeing to skip.)"
        )

    def _sentence(self, loss_step: int | None, finite: bool = True) -> str | None:
        if self.first is None:
            return self._set_only()
        if self.floor is not None:
            said = (f"The loss scale is at its floor ({_shown(self.floor[0])} -> {_shown(self.floor[1])}): it cannot "
                    "go lower, so every step whose gradients overflow is skipped.")  # fmt: skip
            if self.floored == self.count >= 2:
                said += (f" All {self.count} overflow lines are at the floor{self._steps()}: each step they cover "
                         "overflows and is skipped (persistent inf or NaN gradients, not a scale calibrating); how many "
                         "steps still train, the run's own step counters say.")  # fmt: skip
            return said
        if self.truncated and self.first == 0 and self.lowest == 0:  # DeepSpeed's int(scale): below 1
            return ("The loss scale prints as 0: DeepSpeed prints the scale through int() (deepspeedai/DeepSpeed "
                    "edaa722 deepspeed/runtime/fp16/loss_scaler.py:276), so it is below 1, under its default floor "
                    "(min_loss_scale 1) and far past any start: the loss or its gradients overflow fp16 even "
                    "unscaled, and each step where they do is skipped (not a scale calibrating).")  # fmt: skip
        if (probe := self.probing(loss_step, finite)) is not None:
            lines = f" ({self.count} overflow lines)" if self.count > 1 else ""
            return (f"{probe[0].upper()}{probe[1:]}{lines}, past a run's start (its first {EARLY} steps), no loss "
                    "the text prints non-finite: a dynamic loss scaler doubles its scale after a window of steps without "
                    "an overflow (DeepSpeed's loss_scale_window, default 1000) and halves it on the next overflow, so "
                    "this is the scaler probing a higher scale, benign, not a NaN failure by itself (a scale that "
                    "keeps falling is one).")  # fmt: skip
        if self.regrew is not None:
            low, again = self.regrew
            return (f"The loss scale grows back between overflows ({_shown(low)}, then {_shown(again)} attempted "
                    "again): periodic overflows, the scale oscillating, not a collapse.")  # fmt: skip
        lowest = self.lowest if self.lowest is not None else self.first
        early = (self.first_step is None or self.first_step <= EARLY) and (self.last_step or 0) <= EARLY
        if self.halved and self.stepped is not None and self.in_a_row and (self.last_step or 0) > EARLY >= 0:
            first, last = self.stepped[0], self.last_step
            if last > first:
                return (f"The loss scale falls from {_shown(self.first)} to {_shown(lowest)} with an overflow on every "
                        f"step from step {first} to {last} ({self.count} overflow line(s)), past a run's start: the "
                        "gradients overflow step after step, not a scale calibrating (that halves for a few steps "
                        "at the start).")  # fmt: skip
        start = self._start()
        reach = start is not None and lowest >= start[2] and early
        if reach and loss_step is not None:
            return (f"The first attempted loss scale is {_shown(self.first)}, {start[0]}, but the "
                    f"{LOSS_ITSELF} at step {loss_step}: a scale calibrating does not explain a NaN "
                    "loss.")  # fmt: skip
        if reach and self.stepless():  # a start or a probe
            return (f"The first attempted loss scale is {_shown(self.first)}, {start[0]}, and it {self._halves()}; no "
                    "line names its step: at a run's start the scale calibrating, later the scaler probing a higher "
                    "scale (it doubles after a window of clean steps), either way not a NaN failure by itself (a scale "
                    "that keeps falling is one).")  # fmt: skip
        if reach:
            return (f"The first attempted loss scale is {_shown(self.first)}, {start[0]}, and it "
                    f"{self._halves()}: the scale calibrating at a run's start, not a NaN failure by "
                    "itself (a scale that keeps falling is one).")  # fmt: skip
        if lowest <= LOW and self.halved and self.first >= HIGH and self.stepped is None:
            return (f"The loss scale is down to {_shown(lowest)} from {_shown(self.first)}, as high as fp16 loss "
                    f"scalers start ({self.count} overflow line(s), halving; no line names its step): at a run's start the "
                    "scale calibrating can halve this far; a scale that keeps falling toward its minimum is the "
                    "gradients overflowing step after step.")  # fmt: skip
        if lowest <= LOW and self.halved:
            where = f" from step {self.first_step}" if self.first_step is not None else ""
            return (f"The loss scale is down to {_shown(lowest)} ({self.count} overflow line(s){where}, halving): the "
                    "gradients overflow step after step, not a calibration.")  # fmt: skip
        return f"{self.count} overflow line(s), the loss scale from {_shown(self.first)} to {_shown(lowest)}."


_SCALE_KEYS = ("loss_scale", "loss scale", "loss-scale")  # a loss scaler's scale, as metric lines print it
# guided-diffusion's and improved-diffusion's fp16 trainers keep the log2 of their scale, from 20.0 (INITIAL_LOG_LOSS_SCALE),
# lowered by 1 on each step whose gradients hold inf or NaN (the step skipped) and raised by fp16_scale_growth (1e-3)
# on each other step; their logger tables print it as `| lg_loss_scale | -0.821 |` (guided-diffusion 22e0df8
# guided_diffusion/fp16_util.py:12, :190-207, its interval's mean; improved-diffusion 1bc7bbb
# improved_diffusion/train_util.py:26, :229-242, :269): tomeramit/SegDiff#20, holdout25 05
LOG2_SCALE_KEY, LOG2_START = "lg_loss_scale", 20.0
LOG2_ZERO = -1074  # 2.0 ** -1074 is the least float above 0; below it 2 ** lg_loss_scale is 0.0
SCALE_KEYS = (*_SCALE_KEYS, LOG2_SCALE_KEY)  # every key whose value PrintedScale reads
# a printed scale below 2^-10 has been halved on overflow after overflow far below any start (fp16 scalers start at
# 2^7, fairseq's fp16_init_scale, or above): fairseq's epoch line prints `loss_scale 0.000` (facebookresearch/fairseq#1529, holdout17 18)
COLLAPSED = 2.0**-10


Where = tuple[int, int | None]  # a line and the step it names
# Megatron-LM's iteration line's skip counter (training_log, core_v0.15.0rc0 megatron/training/training.py:1867)
SKIP_COUNTER = "number of skipped iterations"


@dataclass
class PrintedScale:
    """The loss scale metric lines print (`loss_scale: 16384.0000 (22341.8182)`, Megatron's `loss scale: 8192.0`: its
    value, not a running mean), and where it fell below the one before: a dynamic loss scaler halves its scale on a
    step whose gradients overflow and skips that step (megatron-core 0.15.0rc0 optimizer/grad_scaler.py:115-120 and
    optimizer/optimizer.py:553-555; DeepSpeed 0.16.4 fp16/loss_scaler.py:180-188), so each halving between two lines
    is at least one skipped step. Only the lines read are compared (a marker or a NaN/Inf word: Megatron's iteration
    lines are all read), so a fall is said, never denied. Bounded: a few numbers whatever the log's length."""

    last: float | None = None
    at: Where = (0, None)  # the line and step that printed it
    drop: tuple[float, float, Where, Where] | None = None  # the first fall: (from, to, where each was printed)
    collapsed: tuple[float, Where] | None = None  # the first scale printed below COLLAPSED, where
    falls: int = 0  # lines printing a scale below the one before
    skipped: int = 0  # the steps those falls skipped at least (a fall by 2^k: k halvings, each one; else one)
    inexact: bool = False  # a fall by no power of two (a mean printed, another scaler's factor): no halvings said
    fell: tuple[float, Where] | None = None  # the last fall's scale, where
    lowest: float | None = None  # the lowest scale a fall printed
    uncounted: Where | None = None  # the first line where the scale fell whose skip counter says 0
    stride: int | None = None  # the steps between the last two lines (the logging interval, where none is cut out)
    log2: float | None = None  # the log2 scale printed where `collapsed` was (an lg_loss_scale below 0)
    unmoved: HeldScale = field(default_factory=HeldScale)  # one scale printed while every iteration is skipped

    def feed(self, found: list[tuple[str, str, int]], number: int, step: int | None) -> None:
        """One metric line's (key, value, where) pairs: its scale, if it prints one."""
        for key, value, _ in found:
            if key.lower() in _SCALE_KEYS and (scale := _finite(value)) is not None:
                counter = next((_finite(v) for k, v, _ in found if k.lower() == SKIP_COUNTER), None)
                self.value(scale, number, step, counter)
                return
            if key.lower() == LOG2_SCALE_KEY and (lg := _finite(value)) is not None and lg <= 1000:
                if lg < 0 and self.collapsed is None:  # a scale below 1 from a start of 2^20: collapsed
                    self.collapsed, self.log2 = (2.0**lg, (number, step)), lg
                self.value(2.0**lg, number, step)
                return

    def value(self, scale: float, number: int, step: int | None, skipped: float | None = None) -> None:
        """The scale a metric line at `number` prints (`skipped`: the skip counter it prints beside it, None: none). Its
        counter covers the steps since the line before only where no line was cut out between them (its steps one
        apart, or as far apart as the two lines before: one logging interval)."""
        interval = None if step is None or self.at[1] is None else step - self.at[1]
        covered = interval is not None and interval > 0 and interval in (1, self.stride)
        if self.last is not None and scale < self.last:
            self.drop = self.drop or (self.last, scale, self.at, (number, step))
            self.falls += 1
            power = math.log2(self.last / scale) if scale > 0 else 0.0
            exact = power >= 1 and abs(power - round(power)) < 1e-6
            self.skipped += round(power) if exact else 1
            self.inexact = self.inexact or not exact
            self.fell = (scale, (number, step))
            self.lowest = scale if self.lowest is None else min(self.lowest, scale)
            if skipped == 0 and covered and self.uncounted is None:
                self.uncounted = (number, step)
        self.unmoved.feed(scale, step, skipped, interval if covered else None)
        self.stride = interval
        # a training line's (it names its step) or a scale after another: not a config's `"loss_scale": 0`
        # or `0.0` (DeepSpeed's dynamic scaling)
        training = step is not None or self.last is not None
        if scale < COLLAPSED and training and self.collapsed is None:
            self.collapsed = (scale, (number, step))
        self.last, self.at = scale, (number, step)

    def sentence(self) -> str | None:
        """The falls in words: from where to where, the halvings (the skipped steps) they take at least, whether past a
        run's start (None: the scale never fell)."""
        if self.drop is None:
            return None
        high, low, before, after = self.drop
        said = (f"The loss scale its metric lines print falls from {_shown(high)} at {where_words(*before)} to "
                f"{_shown(low)} at {where_words(*after)}")  # fmt: skip
        if self.falls > 1 and self.fell is not None:
            more = "then" if self.falls == 2 else f"and {self.falls - 1} more times, the last"
            said += f", {more} to {_shown(self.fell[0])} at {where_words(*self.fell[1])}"
        if self.skipped == 1:
            said += ": a dynamic loss scaler found inf or NaN gradients in between and skipped a step"
        elif self.inexact:
            said += (f": a dynamic loss scaler found inf or NaN gradients and skipped at least {self.skipped} steps in "
                     "between")  # fmt: skip
        else:
            said += (f": at least {self.skipped} halvings, each a step whose gradients held inf or NaN and that a "
                     "dynamic loss scaler skipped")  # fmt: skip
        if before[1] is not None and before[1] > EARLY:
            return (f"{said}, past a run's start (its first {EARLY} steps, where a scale calibrates): gradients "
                    "overflowing mid-run, not a scale calibrating.")  # fmt: skip
        if self.lowest is not None and self.lowest < LOW:  # below where a calibration from 2^16 or more halves to
            return f"{said}."
        return f"{said} (at a run's start, its scale calibrating)."

    def past_start(self) -> bool:
        """The scale fell past a run's start (the step before its first fall is past EARLY)."""
        return self.drop is not None and self.drop[2][1] is not None and self.drop[2][1] > EARLY

    def at_row(self, fed: int, row: int) -> None:
        """A logger table fed as one line at `fed` prints its scale on its own `row`: a collapse seen there is said
        at that row (launch.logger_tables)."""
        if self.collapsed is not None and self.collapsed[1][0] == fed:
            self.collapsed = (self.collapsed[0], (row, self.collapsed[1][1]))

    def log2_sentence(self) -> str | None:
        """An lg_loss_scale printed below 0, in words: the overflowing steps it proves (None: none printed)."""
        if self.log2 is None or self.collapsed is None:
            return None
        at_least = math.ceil(LOG2_START - self.log2)
        tail = ("a scale below 1 means the gradients hold inf or NaN even unscaled (an overflow, or a non-finite "
                "forward pass or weights, which no scale helps): not a calibration")  # fmt: skip
        if self.log2 < LOG2_ZERO:  # 2 ** lg_loss_scale is 0.0: the norm divided by it is inf or NaN, whatever it is
            tail = (
                f"below {LOG2_ZERO} the scale, 2 ** lg_loss_scale in a Python float, is 0.0, and the gradient norm "
                "is divided by it: inf or NaN whatever the gradients, so every step is skipped from then on and "
                "the run no longer trains (guided-diffusion 22e0df8 guided_diffusion/fp16_util.py:192-194, :225)"
            )
        return (f"The {LOG2_SCALE_KEY} its metric lines print is {self.log2:g} at {where_words(*self.collapsed[1])}: "
                f"the log2 of guided-diffusion's fp16 loss scale (improved-diffusion's the same), which starts at "
                f"{LOG2_START:g}, falls by 1 on each step whose gradients hold inf or NaN (that step skipped) and "
                f"rises by 0.001 on every other, so at least {at_least} steps were skipped; {tail}.")  # fmt: skip

    def uncounted_sentence(self) -> str | None:
        """The lines' own skip counter at 0 where the scale fell (None: not printed so)."""
        if self.uncounted is None:
            return None
        return (f"The same lines print `{SKIP_COUNTER}: 0` at {where_words(*self.uncounted)}, where the scale fell: "
                "the steps skipped there are not in that counter (Megatron-LM's counts each step its own optimizer "
                "skips over the interval a line covers: core_v0.15.0rc0 megatron/training/training.py:1553-1558, "
                ":1867).")  # fmt: skip


def where_words(line: int, step: int | None) -> str:
    """Where a metric line was printed, as said: `line 5 (step 29040)`."""
    return f"line {line} (step {step})" if step is not None else f"line {line}"


def _finite(value: str) -> float | None:
    try:
        number = float(value.strip("'\""))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


LOSS_ITSELF = "loss itself is non-finite"  # what a scale cannot explain, said once in a verdict


def forward_loss(reading) -> str | None:
    """Beside a loss scaler's overflows, a loss the metric line `reading` (launch.readings.Reading) prints non-finite:
    the forward pass already is, which no scale explains (a scaler multiplies the loss only for the backward, after
    the forward computed it); None: no loss on it is."""
    if reading is None or reading.contradicted is not None:
        return None
    losses = [key for key, value in reading.values if _forward_loss(key) and value != "missing"]
    if not losses:
        return None
    return (f"The {LOSS_ITSELF} ({losses[0]} at line {reading.line}): a loss scaler multiplies the loss "
            "only for the backward, after the forward computed it, so the forward pass (its weights or its inputs) "
            "was already non-finite there, and no scale, lowered or raised, explains or cures that.")  # fmt: skip


def _forward_loss(key: str) -> bool:
    """A key naming a loss the forward pass computes (not a loss scale, not a gradient)."""
    key = key.lower()
    return "loss" in key and "scale" not in key and "grad" not in key
