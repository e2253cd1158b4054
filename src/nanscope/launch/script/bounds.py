"""How much the launch reader reads at most, and what one reading has spent of it.

Reading is bounded, whatever the script: files are regular and at most `INPUT_LIMIT` bytes; nesting,
value and array sizes, `seq` and the total expansion work are capped (`MAX_*`). A value that hits a
cap raises `Cap`, as does one bash itself would reject (`arithmetic`); the reader keeps it as a
placeholder with a note (`Budget.note`), and the rest of the script still reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from nanscope import inputs

INPUT_LIMIT = 4 * inputs.MiB  # bytes of a script, a sourced file, a model-args file
OPTION = "--max-input-mb"  # the doctor option that raises INPUT_LIMIT
MAX_DEPTH = 100  # nested statements, expansions and arithmetic
MAX_VALUE = 1 << 20  # characters of one value: a word, a string, all elements of an array
MAX_ITEMS = 1 << 16  # words of one value (an array, a `seq`, one command)
MAX_WORK = 1 << 26  # characters (plus 64 per word) that all expansions of one script may produce
MAX_STEPS = 1 << 18  # statements, words and arithmetic operations read; then reading stops
MAX_SOURCES = 8  # nested `source` files followed
WORD_COST = 64  # what one word costs beyond its characters (a Python str)
SNIPPET = 200  # characters of source text kept in a placeholder or a note
MAX_NOTES = 20  # limit notes kept; the rest are counted
MAX_PLACEHOLDERS = 100  # distinct placeholders kept


class Cap(Exception):
    """A value static reading gives up on: a cap was hit, or bash itself would reject it (the reason)."""


def too_long() -> str:
    return f"longer than {MAX_VALUE:,} characters or {MAX_ITEMS:,} words"


def joined(parts: Iterable[str], sep: str = "") -> str:
    """`sep.join(parts)`, stopping (a Cap) as soon as it grows past MAX_VALUE."""
    out, size = [], -len(sep)
    for part in parts:
        size += len(sep) + len(part)
        if size > MAX_VALUE:
            raise Cap(too_long())
        out.append(part)
    return sep.join(out)


def _too_much_work() -> str:
    return f"the script expands to more than {MAX_WORK >> 20} Mi characters in all"


class Budget:
    """What one reading has spent of the caps, and its notes on the values kept as text at one."""

    def __init__(self) -> None:
        self.level = 0  # nested statements, words and arithmetic
        self.work = 0  # characters produced so far (MAX_WORK)
        self.steps = 0  # statements, words and operations read so far (MAX_STEPS)
        self.stopped: int | None = None  # the line where MAX_STEPS stopped reading
        self.notes: list[str] = []  # at most MAX_NOTES
        self.dropped = 0  # notes past MAX_NOTES

    def admit(self, line: int) -> bool:
        """Count one statement at `line`: False (with a note) when it is past MAX_STEPS or MAX_DEPTH."""
        self.steps += 1
        if self.steps > MAX_STEPS:
            if self.stopped is None:
                self.stopped = line
                self.note(line, f"more than {MAX_STEPS:,} statements, words and operations: the rest is not read")
            return False
        if self.level >= MAX_DEPTH:
            self.note(line, f"statements nested more than {MAX_DEPTH} deep: not read")
            return False
        return True

    @contextmanager
    def nested(self) -> Iterator[None]:
        """One level of nesting more, for as long as the block runs."""
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    @contextmanager
    def deeper(self) -> Iterator[None]:
        """One level of nesting more (a Cap past MAX_DEPTH, or once MAX_WORK or MAX_STEPS is spent)."""
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise Cap(f"more than {MAX_STEPS:,} statements, words and operations")
        if self.level >= MAX_DEPTH:
            raise Cap(f"nested more than {MAX_DEPTH} deep")
        if self.work > MAX_WORK:
            raise Cap(_too_much_work())
        with self.nested():
            yield

    def charge(self, values: list) -> None:
        """Count what an expansion produced against MAX_VALUE, MAX_ITEMS and MAX_WORK."""
        size = sum(len(value) for value in values)
        self.work += size + WORD_COST * len(values)
        if size > MAX_VALUE or len(values) > MAX_ITEMS:
            raise Cap(too_long())
        if self.work > MAX_WORK:
            raise Cap(_too_much_work())

    def note(self, line: int, text: str) -> None:
        """A note on a value kept as text at `line` (counted, not kept, past MAX_NOTES)."""
        if len(self.notes) < MAX_NOTES:
            self.notes.append(f"line {line}: {text}")
        else:
            self.dropped += 1

    def all_notes(self) -> list[str]:
        """The notes kept, then how many more there were."""
        return self.notes + ([f"{self.dropped} more value(s) kept as text at a reading limit"] if self.dropped else [])

    def stop_hint(self) -> str:
        """Where MAX_STEPS stopped reading, for the error of a script without a train command ('' if it did not)."""
        if self.stopped is None:
            return ""
        return f" (reading stopped at line {self.stopped}: more than {MAX_STEPS:,} statements, words and operations)"
