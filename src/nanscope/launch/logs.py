"""A job's log read as a stream: its first Megatron error, the traceback that ends there, and the later errors' ranks.

A log is any size (a 64-rank Ray driver log is far over the input cap, and only the error's lines matter), so it
is read in chunks of CHUNK bytes, and only the lines that hold "Unexpected" (every Megatron error line does;
the last line, which may be cut short, is looked at for "Rank" too) are decoded and parsed. What is kept is
the last CONTEXT bytes before the first error (its traceback) and the ranks of the later ones: memory is
bounded by CHUNK + MAX_LINE + CONTEXT, whatever the log's size, and reading goes at the speed of
`bytes.find` (hundreds of MB/s). A line longer than MAX_LINE is read in pieces of that size.

The lines read are cleaned as a terminal would show them: ANSI escapes (colours `ESC[36m`, `ESC[K`, OSC titles)
are removed, and for the traceback Ray's worker prefix `(MegatronTrainRayActor pid=.., ip=..)` as well.

    found = read_log("driver.log")   # None: no Megatron error in it
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.launch.failure import Failure, line_failures

CHUNK = 4 * inputs.MiB  # bytes read at once
MAX_LINE = inputs.MiB  # a line longer than this is read in pieces
CONTEXT = inputs.MiB  # bytes before the first error kept: its traceback
MAX_RANKS = 4096  # distinct ranks of later errors kept

_MARKER = re.compile(rb"Unexpected")
_LAST = re.compile(rb"Unexpected|Rank")  # the last line may be cut inside "Unexpected result"
# CSI (colours, ESC[K, cursor moves), OSC (window titles, links) ended by BEL or ESC \, and two-byte escapes
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_RAY_PREFIX = re.compile(r"^\((?:[\w.:-]+ )?pid=\d+(?:, ip=[^)\s]+)?\) ?")
_TRACEBACK = "Traceback (most recent call last):"


def clean(line: str) -> str:
    """The line as a terminal shows it: without ANSI escapes or a trailing carriage return."""
    return _ANSI.sub("", line).rstrip("\r") if "\x1b" in line else line.rstrip("\r")


@dataclass
class Found:
    """The first Megatron error of a log.

    Attributes:
        failure: its error line.
        context: the cleaned lines of the traceback that ends at it (from its last `Traceback (most recent call
            last):` line, at most CONTEXT bytes), Ray's worker prefixes removed, then the error line itself.
        others: the ranks of the later errors, other than the first's (at most MAX_RANKS), ascending.
    """

    failure: Failure
    context: list[str]
    others: list[int] = field(default_factory=list)


class _Scanner:
    """Feeds chunks of a log; keeps the first error, what came before it, and the later errors' ranks."""

    def __init__(self, origin: str):
        self.origin = origin
        self.carry = b""  # the start of a line the next chunk ends
        self.tail = b""  # the last CONTEXT bytes of complete lines, until the first error
        self.lines = 0  # newlines before the next block
        self.first: Failure | None = None
        self.context: list[str] = []
        self.ranks: set[int] = set()

    def feed(self, chunk: bytes) -> None:
        buf = self.carry + chunk
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) <= MAX_LINE:
                self.carry = buf
                return
            cut = len(buf)  # a line longer than MAX_LINE: this piece now, the rest with the next chunk
        self.carry = buf[cut:]
        self._block(buf[:cut], _MARKER)

    def finish(self) -> Found | None:
        if self.carry:
            self._block(self.carry, _LAST)
            self.carry = b""
        if self.first is None:
            return None
        return Found(self.first, self.context, sorted(self.ranks))

    def _block(self, block: bytes, marker: re.Pattern) -> None:
        """The lines of `block` that hold `marker`; then what to keep of it."""
        pos = counted = 0
        lines = self.lines
        while (hit := marker.search(block, pos)) is not None:
            start = block.rfind(b"\n", 0, hit.start()) + 1
            end = block.find(b"\n", hit.end())
            end = len(block) if end < 0 else end
            lines += block.count(b"\n", counted, start)
            counted = start
            self._line(block, start, end, lines + 1)
            pos = end + 1
        self.lines = lines + block.count(b"\n", counted)
        self.tail = (self.tail + block)[-CONTEXT:] if self.first is None else b""

    def _line(self, block: bytes, start: int, end: int, number: int) -> None:
        text = clean(block[start:end].decode("utf-8", "replace"))
        found = list(line_failures(text, number, self.origin))
        if not found:
            return
        if self.first is None:
            self.first = found[0]
            self.context = _traceback_lines(self.tail + block[:start]) + [text]
        for failure in found:
            if failure.rank != self.first.rank and len(self.ranks) < MAX_RANKS:
                self.ranks.add(failure.rank)


def _traceback_lines(before: bytes) -> list[str]:
    """The cleaned lines of `before` from its last traceback header (all of them if it has none)."""
    cut = len(before) > CONTEXT
    lines = before[-CONTEXT:].decode("utf-8", "replace").split("\n")
    lines = lines[1 if cut else 0 : -1]  # a line cut by CONTEXT; the empty string after the last newline
    lines = [_RAY_PREFIX.sub("", clean(line)) for line in lines]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith(_TRACEBACK):
            return lines[i:]
    return lines


def scan(chunks: Iterable[bytes], origin: str = "traceback") -> Found | None:
    """The first Megatron error of the log whose bytes are `chunks`, in order (None: there is none).

    Raises:
        UserError: an error line with a number more digits long than any Megatron prints.
    """
    scanner = _Scanner(origin)
    for chunk in chunks:
        scanner.feed(chunk)
    return scanner.finish()


def read_log(path: str, what: str = "traceback") -> Found | None:
    """`scan` of the file at `path`, which must be a regular file (of any size).

    Raises:
        UserError: not a regular file, unreadable, or a Megatron error line with an impossible number.
    """
    inputs.check_file(path, what)
    try:
        with open(path, "rb") as log:
            return scan(iter(partial(log.read, CHUNK), b""), str(path))
    except OSError as error:
        raise UserError(f"{path}: {what}: cannot read: {error.strerror or error}") from None
