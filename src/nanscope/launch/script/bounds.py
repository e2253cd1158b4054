"""How much the launch reader reads at most, and what one reading has spent of it.

Reading is bounded, whatever the script: files are regular and at most `INPUT_LIMIT` bytes, at most
`MAX_FILES` of them; nesting, value and array sizes, `seq` and the total expansion work are capped (`MAX_*`).
A value that hits a cap raises `Cap`, as does one bash itself would reject (`arithmetic`); the reader keeps
it as a placeholder with a note (`Budget.note`), and the rest of the script still reads. tree-sitter's parse
has an allowance of CPU time (`Budget.parse_allowance`): PARSE_SECONDS, plus PARSE_SECONDS_PER_MIB for each
MiB read (a script of one-letter commands, the densest, parses at 1 s per MiB; a real one 10 times faster),
and of memory (PARSE_MEMORY, plus PARSE_MEMORY_PER_BYTE per byte: 4 MiB of one-letter commands take 0.9 GB).
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
MAX_CALLS = 32  # nested calls of the script's own functions read
MAX_FILES = 64  # files read in all (the script, sourced files, a --model-args file)
PARSE_SECONDS = 0.25  # tree-sitter's CPU time for a reading, plus PARSE_SECONDS_PER_MIB per MiB read
PARSE_SECONDS_PER_MIB = 1.5
PARSE_MEMORY = 256 * inputs.MiB  # what tree-sitter may grow the process by, plus PARSE_MEMORY_PER_BYTE per byte
PARSE_MEMORY_PER_BYTE = 256
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
        self.files = 0  # files read so far (MAX_FILES)
        self.parse_left = PARSE_SECONDS  # seconds tree-sitter may still take in this reading

    def parse_allowance(self, size: int) -> float:
        """The CPU seconds tree-sitter may take to parse `size` more bytes: what the reading has left (PARSE_SECONDS
        at first) plus PARSE_SECONDS_PER_MIB per MiB; `spent` takes off what the parse took."""
        self.parse_left += size * PARSE_SECONDS_PER_MIB / inputs.MiB
        return self.parse_left

    def spent(self, seconds: float) -> None:
        self.parse_left -= seconds

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
