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
from dataclasses import dataclass

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
    floor: tuple[float, float] | None = None  # an attempted scale the scaler could not lower: (attempted, set)
    halved: bool = False  # a scale was lowered
    stepped: tuple[int, int, str | None] | None = None  # the first overflow line that has a step: (step, line, how)
    last_step: int | None = None  # the last overflow line's step
    in_a_row: bool = True  # the overflow lines' steps follow one another (each the one before + 1)
    floored: int = 0  # overflow lines at the floor (attempted = set <= 1)
    first_set: float | None = None  # the first scale set, where the lines print only that (apex amp, DLLogger)
    copies: int = 0  # lines repeating the halving on the line just before: another process's print of one overflow
    previous: tuple | None = None  # the last line added: (line, attempted, set, its time to the second, its rank)

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
            elif scale is not None and next_scale == scale and self._floor(scale):
                self.floor = self.floor or (scale, next_scale)
                self.floored += 1
            self.last = next_scale
            self.lowest = next_scale if self.lowest is None else min(self.lowest, next_scale)

    def step(self, step: int | None, line: int, how: str | None) -> None:
        """The step of the overflow line just added (None: it names none)."""
        if step is None:
            return
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
        if self.first_set is None or self.lowest is None or self.count < 2 or self.lowest >= self.first_set:
            return None
        if self.collapsed():
            start = _shown(self.first_set) if self.first_set >= 1 else repr(self.first_set)  # as printed
            return (f"The loss scale the scaler set is down to {self.lowest!r} ({self.count} overflow line(s), "
                    f"from {start}), below 1: halved on every overflow far past any start, so every "
                    "step overflows and is skipped and the run does not train; the loss or its gradients are "
                    "non-finite whatever the scale (not a scale calibrating).")  # fmt: skip
        return (f"The loss scale the scaler set falls from {_shown(self.first_set)} to {_shown(self.lowest)} over "
                f"{self.count} overflow line(s) (the scale it attempted is not printed): steps with inf or NaN "
                "gradients keep coming, each one skipped.")  # fmt: skip

    def calibrating(self, loss_step: int | None = None) -> bool:
        """The series is a scale calibrating at a run's start (a high first scale halving, not far, early), and no
        loss went non-finite: no NaN failure by itself."""
        if self.first is None or self.floor is not None or self.regrew is not None or loss_step is not None:
            return False
        lowest = self.lowest if self.lowest is not None else self.first
        still = self.last_step is not None and self.last_step > EARLY  # still falling past a run's start
        return (
            self.first >= HIGH and lowest >= LOW and (self.first_step is None or self.first_step <= EARLY) and not still
        )

    def sentence(self, loss_step: int | None = None) -> str | None:
        """What the series says, in one or two sentences (None: no scale printed)."""
        said = self._sentence(loss_step)
        if said is None or not self.copies:
            return said
        return (
            f"{said} ({self.copies} more line(s) repeat an overflow on the line just before it: the same "
            "overflow printed by another process, each data-parallel rank's optimizer agreeing to skip.)"
        )

    def _sentence(self, loss_step: int | None) -> str | None:
        if self.first is None:
            return self._set_only()
        if self.floor is not None:
            said = (f"The loss scale is at its floor ({_shown(self.floor[0])} -> {_shown(self.floor[1])}): it cannot "
                    "go lower, so every step whose gradients overflow is skipped.")  # fmt: skip
            if self.floored == self.count >= 2:
                said += (f" All {self.count} overflow lines are at the floor{self._steps()}: every step they cover "
                         "overflows and is skipped, so the run does not train (persistent inf or NaN gradients, not a "
                         "scale calibrating).")  # fmt: skip
            return said
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
        if self.first >= HIGH and lowest >= LOW and early and loss_step is not None:
            return (f"The first attempted loss scale is {_shown(self.first)}, where fp16 loss scalers start, but the "
                    f"loss itself is non-finite at step {loss_step}: a scale calibrating does not explain a NaN "
                    "loss.")  # fmt: skip
        if self.first >= HIGH and lowest >= LOW and early:
            halves = ("is kept (the overflow spent the scaler's hysteresis)" if not self.halved
                      else "halves on consecutive overflows" if self.count > 1 else "halves once")  # fmt: skip
            return (f"The first attempted loss scale is {_shown(self.first)}, where fp16 loss scalers start, and it "
                    f"{halves}: the scale calibrating at a run's start, not a NaN failure by "
                    "itself (a scale that keeps falling is one).")  # fmt: skip
        if lowest <= LOW and self.halved and self.first >= HIGH and self.stepped is None:
            return (f"The loss scale is down to {_shown(lowest)} from {_shown(self.first)}, where fp16 loss scalers "
                    f"start ({self.count} overflow line(s), halving; no line names its step): at a run's start the "
                    "scale calibrating can halve this far; a scale that keeps falling toward its minimum is the "
                    "gradients overflowing step after step.")  # fmt: skip
        if lowest <= LOW and self.halved:
            where = f" from step {self.first_step}" if self.first_step is not None else ""
            return (f"The loss scale is down to {_shown(lowest)} ({self.count} overflow line(s){where}, halving): the "
                    "gradients overflow step after step, not a calibration.")  # fmt: skip
        return f"{self.count} overflow line(s), the loss scale from {_shown(self.first)} to {_shown(lowest)}."


_SCALE_KEYS = ("loss_scale", "loss scale", "loss-scale")  # a loss scaler's scale, as metric lines print it
# a printed scale below 2^-10 has been halved on overflow after overflow far below any start (fp16 scalers start at
# 2^7, fairseq's fp16_init_scale, or above): fairseq's epoch line prints `loss_scale 0.000` (facebookresearch/fairseq#1529, holdout17 18)
COLLAPSED = 2.0**-10


@dataclass
class PrintedScale:
    """The loss scale metric lines print (`loss_scale: 16384.0000 (22341.8182)`: its value, not a running mean),
    and the first line read where it fell below the one before: a dynamic loss scaler skipped an overflowing step in
    between. Only the lines read are compared (a marker or a NaN/Inf word), so a fall is said, never denied."""

    last: float | None = None
    at: tuple[int, int | None] = (0, None)  # the line and step that printed it
    drop: tuple[float, float, tuple[int, int | None], tuple[int, int | None]] | None = None  # (from, to, where
    # each was printed: (line, step))
    collapsed: tuple[float, tuple[int, int | None]] | None = None  # the first scale printed below COLLAPSED, where

    def feed(self, found: list[tuple[str, str, int]], number: int, step: int | None) -> None:
        """One metric line's (key, value, where) pairs: its scale, if it prints one."""
        for key, value, _ in found:
            if key.lower() in _SCALE_KEYS and (scale := _finite(value)) is not None:
                if self.last is not None and scale < self.last and self.drop is None:
                    self.drop = (self.last, scale, self.at, (number, step))
                # a training line's (it names its step) or a scale after another: not a config's `"loss_scale": 0`
                # or `0.0` (DeepSpeed's dynamic scaling)
                training = step is not None or self.last is not None
                if scale < COLLAPSED and training and self.collapsed is None:
                    self.collapsed = (scale, (number, step))
                self.last, self.at = scale, (number, step)
                return


def _finite(value: str) -> float | None:
    try:
        number = float(value.strip("'\""))
    except ValueError:
        return None
    return number if math.isfinite(number) else None
