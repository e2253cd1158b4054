"""The argparse types of every numeric option of every command: ASCII digits only, each within its documented range.

    p.add_argument("--seed", type=numbers.SEED, default=0)
    p.add_argument("--workers", type=numbers.Integer(1, 1024))
    p.add_argument("--max-input-mb", type=numbers.MEBIBYTES)      # in bytes

A value out of its range, or not a number as written in ASCII (Python's int() and float() take '٥٠' and '５'),
is argparse's error, one line naming the option and the range, exit 2. docs/index.md lists the ranges.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from nanscope.facts import ranges
from nanscope.inputs import MiB

_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")  # a longer one is out of every range: not converted at all
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,4})?")
_SHOWN = 40  # characters of a bad value an error line quotes


def _shown(text: str) -> str:
    return repr(text) if len(text) <= _SHOWN else f"{text[:_SHOWN]!r}... ({len(text)} characters)"


@dataclass(frozen=True)
class Integer:
    """An integer from `low` to `high`, both included, written in ASCII digits."""

    low: int
    high: int

    def __call__(self, text: str) -> int:
        value = int(text) if _INTEGER.fullmatch(text.strip()) else None
        if value is None or not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(f"{_shown(text)}: expected an integer from {self.low} to {self.high:,}")
        return value


@dataclass(frozen=True)
class Decimal:
    """A finite number above `low` (excluded) and at most `high`, written in ASCII (12, 1.5, 2e-3)."""

    low: float
    high: float
    unit: str = ""

    def __call__(self, text: str) -> float:
        value = float(text) if _DECIMAL.fullmatch(text.strip()) else math.nan
        if not (math.isfinite(value) and self.low < value <= self.high):
            unit = f" {self.unit}" if self.unit else ""
            raise argparse.ArgumentTypeError(
                f"{_shown(text)}: expected a number{unit} > {self.low:g} and <= {self.high:g}"
            )
        return value


@dataclass(frozen=True)
class Mebibytes:
    """A size in MiB (a decimal number, at least one byte), returned in bytes."""

    high: int

    def __call__(self, text: str) -> int:
        mebibytes = float(text) if _DECIMAL.fullmatch(text.strip()) else math.nan
        if not (math.isfinite(mebibytes) and 1 / MiB <= mebibytes <= self.high):
            raise argparse.ArgumentTypeError(
                f"{_shown(text)}: expected a size in MiB from {1 / MiB:.7f} (one byte) to {self.high:,}"
            )
        return int(mebibytes * MiB)


# The ranges, each once (docs/index.md, "Numbers"; a rank's and a seed's are `nanscope.facts.ranges`').
SEED = Integer(0, ranges.MAX_SEED)
RANK = Integer(0, ranges.MAX_RANK)
STEPS = 100  # --steps, --inject-step, --fault-step: every step is a full optimizer step of the harness
STEP = Integer(1, STEPS)
PARALLEL = Integer(1, 65536)  # a parallel size (TP, CP) or a group size
COUNT = Integer(1, 1_000_000)  # rows and hazards listed
ROWS = Integer(0, 1_000_000)  # 0: the counts only
WORKERS = Integer(1, 1024)
TOKENS = Integer(1, 2**31 - 1)  # a length in tokens
DUMP_MB = Integer(1, 1 << 20)  # scan's --max-dump-mb: up to 1 TiB
MEBIBYTES = Mebibytes(1 << 20)  # doctor's and trace's --max-input-mb: one byte to 1 TiB
SECONDS = Decimal(0, 7 * 24 * 3600, "of seconds")  # --timeout, --ray-timeout: up to a week
LEARNING_RATE = Decimal(0, 1)
