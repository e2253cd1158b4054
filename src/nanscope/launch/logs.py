"""A job's log read as a stream: its first Megatron error, the traceback that ends there, the later errors' ranks and
the rerun state machine's verdict; without an error line, the log's last traceback.

A log is any size (a 64-rank Ray driver log is far over the input cap, and only the error's lines matter), so it
is read in chunks of CHUNK bytes, and only the lines that hold a marker (`_MARKERS`: every form of Megatron's error
line and of the rerun verdict has one; the last line, which may be cut short, is looked at for "Rank" too) are
decoded and parsed. What is kept is the last CONTEXT bytes before the first error (its traceback), the ranks of the
later ones and the verdicts: memory is bounded by CHUNK + MAX_LINE + CONTEXT, whatever the log's size, and reading
goes at the speed of a literal search for each marker (about 500 MB/s) and of the metric scan before the first
error (`launch.metrics`: about 80 MB/s where every line is a metric line). A line longer than MAX_LINE is read in
pieces of that size.

The lines read are cleaned as a terminal would show them: ANSI escapes (colours `ESC[36m`, `ESC[K`, OSC titles)
are removed, and for the traceback the log prefixes (`strip_prefix`: Ray's `(MegatronTrainRayActor pid=.., ip=..)`
and `(ActorWorker(actor_train-1) pid=.., ip=..)`, torchrun's `[rank14]:` and `[default2]:`, srun's `29: `,
NeMo-Run's `i.pretrain/0 `, timestamps) as well. Where ranks interleave their lines, the traceback keeps the failing
rank's (`[rankN]:`) lines.

    found = read_log("driver.log")   # None: no Megatron error and no traceback in it
    found = read_log("-")            # standard input
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.launch import anomaly, code_lines, native_errors, trainer_bars
from nanscope.launch.elastic import Elastic
from nanscope.launch.failure import Failure, Impossible, line_failures
from nanscope.launch.logsource import open_log
from nanscope.launch.metrics import Metrics
from nanscope.launch.nonfinite import Nonfinite
from nanscope.launch.rerun import Rerun, last_word, line_verdict

CHUNK = 4 * inputs.MiB  # bytes read at once
MAX_LINE = inputs.MiB  # a line longer than this is read in pieces
CONTEXT = inputs.MiB  # bytes before the first error kept: its traceback
MAX_RANKS = 4096  # distinct ranks of later errors kept
MAX_VERDICTS = 64  # rerun verdict lines kept
STDIN = "-"

# Each a literal, searched on its own (a literal search runs at GB/s; one alternation of them at a tenth of that)
_MARKERS = tuple(
    re.compile(re.escape(marker))
    for marker in (
        b"Unexpected",
        b" in local ",
        b"found unexpected",
        b"='Spiky loss",
        b"rerun: unexpected",
        b"Possible ",
        b"Correct result",
    )
)
_LAST = (*_MARKERS, re.compile(rb"Rank "))  # the last line may be cut inside the error's prefix
# CSI (colours, ESC[K, cursor moves), OSC (window titles, links) ended by BEL or ESC \, and two-byte escapes
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# One log prefix at a line's start: a Ray worker `(Name pid=1, ip=..)` or `(Name(args) pid=1)`, srun's `12: `,
# NeMo-Run's `i.pretrain/0 `, torchrun's `[default2]:` and `[rank14]:`, a bracketed or bare timestamp.
_PREFIX = re.compile(
    r"(?:\((?:[\w.:-]+(?:\([^()\s]*\))? )?pid=\d+(?:, ip=[^)\s]+)?\) ?|\s*\d{1,6}: (?=\[)|[\w.-]+/\d+ (?=\[)"
    r"|\[default\d+\]:|\[rank\d+\]: ?|\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\]? ?)"
)
_RANK_TAG = re.compile(r"\[rank(\d+)\]:")
_TRACEBACK = "Traceback (most recent call last):"
_HEADER = _TRACEBACK.encode()


def clean(line: str) -> str:
    """The line as a terminal shows it: without ANSI escapes or a trailing carriage return."""
    return _ANSI.sub("", line).rstrip("\r") if "\x1b" in line else line.rstrip("\r")


def strip_prefix(line: str) -> str:
    """The line without the log prefixes before it (any number of them, as log collectors stack them)."""
    pos = 0
    while (match := _PREFIX.match(line, pos)) is not None and match.end() > pos:
        pos = match.end()
    return line[pos:]


@dataclass
class Found:
    """What a log says about its NaN.

    Attributes:
        failure: its first Megatron error line (None: the log has none, only a traceback or a verdict).
        context: the cleaned lines of the traceback that ends at it (from its last `Traceback (most recent call
            last):` line, at most CONTEXT bytes), log prefixes removed, then the error line itself; without an error
            line, the log's last traceback.
        others: the ranks of the later errors, other than the first's (at most MAX_RANKS), ascending.
        rerun: the rerun state machine's last word on it (None: the log has no verdict).
        raw: the context's lines with their log prefixes (which name a framework: facts.frameworks.TEXTS).
        metrics: the per-step metric lines before the failure (launch.metrics): where each left its range.
    """

    failure: Failure | None
    context: list[str]
    others: list[int] = field(default_factory=list)
    rerun: Rerun | None = None
    raw: list[str] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    notes: list[str] = field(default_factory=list)  # what was not read, and why (an impossible number, an encoding)
    nonfinite: Nonfinite = field(default_factory=Nonfinite)  # the other stacks' evidence lines and metric lines
    signal: tuple[list[str], list[str]] | None = None  # (context, raw) of the first fatal evidence line
    lines: int = 0  # the log's lines, all of them
    quiet: bool = False  # readable text with nothing in it nanscope reads: no error, no traceback, no metric line
    later: list[str] = field(default_factory=list)  # the log's last traceback, after a fatal evidence line's own
    head: list[str] = field(default_factory=list)  # the log's first lines (HEAD_LINES), cleaned
    forward: list[str] = field(default_factory=list)  # anomaly mode's warning after its header (launch.anomaly)
    elastic: Elastic = field(default_factory=Elastic)  # torch elastic's first observed failure (launch.elastic)
    tracebacks: tuple[int, tuple[int, ...]] = (0, ())  # the `Traceback (most recent call last):` lines: (how many, the
    # first MAX_NOTES of their line numbers)
    native: list[tuple[int, str]] = field(default_factory=list)  # native code's error lines (launch.native_errors)


# Python source (a file, not a log): its first line of code at a line's start
PYTHON = re.compile(
    r"^(?:#!.*python|import \w|from [\w.]+ import |def \w+\(|class \w+[(:]|if __name__ ==)", re.MULTILINE
)
# the bytes a text log does not hold (C0 controls but tab, newline, carriage return and ESC; DEL)
_CONTROL = bytes([*range(0, 9), 11, 12, *range(14, 27), *range(28, 32), 127])
_HEAD = 4096  # bytes kept to tell a log from Python source


HEAD_LINES = 40  # the log's first lines, read for the texts that name a framework (facts.frameworks.TEXTS)
MAX_NOTES = 8  # lines not read as error lines, said one by one; the rest counted


class _Scanner:
    """Feeds chunks of a log; keeps the first error, what came before it, the later errors' ranks, the verdicts."""

    def __init__(self, origin: str):
        self.origin = origin
        self.carry = b""  # the start of a line the next chunk ends
        self.tail = b""  # the last CONTEXT bytes of complete lines, until the first error
        self.lines = 0  # newlines before the next block
        self.first: Failure | None = None
        self.context: list[str] = []
        self.raw: list[str] = []
        self.ranks: set[int] = set()
        self.verdicts: list[Rerun] = []
        self.metrics = Metrics()
        self.impossible: list[str] = []  # lines whose rank, device or iteration no Megatron prints (not read)
        self.skipped = 0
        self.nonfinite = Nonfinite()
        self.signal: tuple[list[str], list[str]] | None = None  # the first fatal evidence line's traceback
        self.size = 0  # bytes fed
        self.controls = 0  # of them, control bytes no text log holds (a binary file's)
        self.head = b""  # the first _HEAD bytes
        self.forward: list[str] | None = None  # anomaly mode's forward call before the first fatal evidence line
        self.elastic = Elastic()  # torch elastic's first observed failure, wherever in the log
        self.tracebacks: tuple[int, tuple[int, ...]] = (0, ())  # Found.tracebacks
        self.native: list[tuple[int, str]] = []  # Found.native

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.controls += len(chunk) - len(chunk.translate(None, _CONTROL))
        if len(self.head) < _HEAD:
            self.head = (self.head + chunk)[:_HEAD]
        buf = self.carry + chunk
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) <= MAX_LINE:
                self.carry = buf
                return
            cut = len(buf)  # a line longer than MAX_LINE: this piece now, the rest with the next chunk
        self.carry = buf[cut:]
        self._block(buf[:cut], _MARKERS)

    def finish(self) -> Found | None:
        lines = self.lines + (1 if self.carry else 0)
        if self.carry:
            self._block(self.carry, _LAST, last=True)
            self.carry = b""
        trainer_bars.settle(self.nonfinite.metrics)  # a Trainer dict's step from the one bar after it
        rerun = last_word(self.verdicts)
        notes = [f"{line}: not read as one" for line in self.impossible]
        if self.skipped > len(self.impossible):
            notes.append(f"{self.skipped - len(self.impossible)} more line(s) with such a number, not read")
        seen = self.nonfinite
        quiet = (
            not seen.first and seen.metrics.first is None and not seen.metrics.counters and seen.metrics.weak is None
        )
        if self.first is None:
            raw = _traceback_lines(self.tail, whole=True)
            if self.signal is not None and not any('File "' in line for line in self.signal[1]):
                self.signal = None  # its frames, if any, come after it: the log's last traceback
            later = raw if self.signal is not None else []
            if self.signal is not None:
                context, raw = self.signal
            else:
                context = _context(raw)
            # a traceback, maybe cut at its head, or what is left of one without its `File "` lines: known code lines
            framed = any(_TRACEBACK in line or 'File "' in line for line in raw) or bool(code_lines.read(raw))
            if quiet and rerun is None and not self.metrics.seen and not framed:
                if self.impossible:  # nothing else: the one line that looked like an error is the answer
                    raise UserError(self.impossible[0])
                if not self._readable():
                    return None
                found = Found(None, [], quiet=True)
            else:
                found = Found(None, context, sorted(self.ranks), rerun=rerun, raw=raw, metrics=self.metrics)
                found.later = later
        else:
            found = Found(self.first, self.context, sorted(self.ranks), rerun=rerun, raw=self.raw, metrics=self.metrics)
        found.notes, found.nonfinite, found.lines = notes, seen, lines
        found.elastic, found.tracebacks, found.native = self.elastic, self.tracebacks, self.native
        if "anomaly-forward" in seen.first:  # the forward call anomaly mode printed (launch.anomaly)
            found.forward = self.forward if self.forward is not None else _forward(self.tail)
        found.head = [clean(line) for line in self.head.decode("utf-8", "replace").split("\n")[:HEAD_LINES]]
        return found

    def _readable(self) -> bool:
        """Text a log holds: not empty or blank, no more than 1 % control bytes (a binary file), no Python source."""
        text = self.head.decode("utf-8", "replace")
        blank = not self.head.strip()
        return not blank and self.controls * 100 <= self.size and PYTHON.search(text) is None

    def _block(self, block: bytes, markers: tuple[re.Pattern, ...], last: bool = False) -> None:
        """The lines of `block` that hold one of `markers`, in order, and the metric lines before the first error;
        then what to keep of it."""
        hits = {block.rfind(b"\n", 0, hit.start()) + 1 for marker in markers for hit in marker.finditer(block)}
        counted, lines, done, metrics = 0, self.lines, -1, self.first is None
        for start in sorted(hits):
            if start <= done:
                continue
            end = block.find(b"\n", start)
            end = len(block) if end < 0 else end
            lines += block.count(b"\n", counted, start)
            counted = start
            end = self._line(block, start, end, lines + 1, last and end == len(block))
            if metrics and self.first is not None:  # the metric lines before the failure only
                self.metrics.scan(block[:start], self.lines)
                metrics = False
            done = end
        if metrics:
            self.metrics.scan(block, self.lines)
        for start, hit in self.nonfinite.block(block, self.lines, clean):
            if self.signal is None:  # the traceback that ends at the first fatal evidence line
                tag = None if hit.rank is None else str(hit.rank)
                raw = _traceback_lines(self.tail + block[:start], rank=tag) + [hit.text]
                self.signal = (_context(raw), raw)
                self.forward = _forward(self.tail + block[:start])
        self.elastic.block(block, self.lines)
        self._headers(block)
        native_errors.scan(block, self.lines, self.native)
        self.lines = lines + block.count(b"\n", counted)
        self.tail = (self.tail + block)[-CONTEXT:] if self.first is None else b""

    def _headers(self, block: bytes) -> None:
        """Count the traceback headers in `block` (its first line is the log's line self.lines + 1)."""
        count, shown = self.tracebacks
        at = block.find(_HEADER)
        while at >= 0:
            count += 1
            if len(shown) < MAX_NOTES:
                shown += (self.lines + block.count(b"\n", 0, at) + 1,)
            at = block.find(_HEADER, at + len(_HEADER))
        self.tracebacks = (count, shown)

    def _line(self, block: bytes, start: int, end: int, number: int, last: bool) -> int:
        """Read the line at `start` (the log's line `number`); where it ends, with a wrapped error's rest."""
        start, end = _unwrapped(block, start, end)
        first, *rest = block[start:end].decode("utf-8", "replace").split("\n")  # rest: a wrapped error's lines
        text = clean(" ".join([first.rstrip()] + [part.strip() for part in rest]) if rest else first)
        verdict = line_verdict(text, number)
        if verdict is not None:
            if len(self.verdicts) < MAX_VERDICTS:
                self.verdicts.append(verdict)
            return end
        try:
            found = list(line_failures(text, number, self.origin, last=last))
        except Impossible as error:  # one junk line does not sink the errors around it
            self.skipped += 1
            if len(self.impossible) < MAX_NOTES:
                self.impossible.append(str(error))
            return end
        if not found:
            return end
        if self.first is not None and _fuller(found[0], self.first):  # a summary line, then the error itself
            self.first = None
        if self.first is None:
            self.first = found[0]
            tag = _RANK_TAG.search(text)
            self.raw = _traceback_lines(self.tail + block[:start], rank=None if tag is None else tag[1]) + [text]
            self.context = _context(self.raw)
        for failure in found:
            if failure.rank is not None and failure.rank != self.first.rank and len(self.ranks) < MAX_RANKS:
                self.ranks.add(failure.rank)
        return end


# the raise form's head, cut after its device or its iteration; its message's line
_WRAP_HEAD = re.compile(
    rb"Rank \d{1,18}, node [^\s,]{1,200}, device (?:\d{1,18}|cpu),(?: iteration -?\d{1,18}:)?\s{0,8}\Z"
)
_WRAP_REST = re.compile(rb"\s{0,40}\(?message='")


def _unwrapped(block: bytes, start: int, end: int) -> tuple[int, int]:
    """The span of Megatron's raise form that `block[start:end]` is a line of, where it is wrapped over three lines
    (`Rank R, node N, device D,` / `iteration I: Unexpected result X` / `(message='M')`: holdout19 13, a paste
    wrapped by hand; `..., iteration I:` / `Unexpected result X` / `message='M'`: holdout19 20): the line before it
    and the one after joined in; else the line."""
    line = block[start:end]
    if b"Unexpected result" not in line:
        return start, end
    if start > 0 and line.lstrip().startswith((b"iteration ", b"Unexpected result")):
        before = block.rfind(b"\n", 0, start - 1) + 1
        if _WRAP_HEAD.search(block, before, start - 1) is not None:
            start = before
    if b"(message=" not in line and end < len(block):
        stop = block.find(b"\n", end + 1)
        stop = len(block) if stop < 0 else stop
        if _WRAP_REST.match(block, end + 1, stop) is not None:
            end = stop
    return start, end


def _fuller(new: Failure, first: Failure) -> bool:
    """`new` is `first`'s error said in full: the same check, and the rank `first` does not name."""
    same = (new.check is None) == (first.check is None) and (new.check is None or new.check.id == first.check.id)
    return same and first.rank is None and new.rank is not None


def _traceback_lines(before: bytes, whole: bool = False, rank: str | None = None) -> list[str]:
    """The cleaned lines of `before` from its last traceback header (all of them if it has none), log prefixes kept.

    Args:
        whole: `before` ends with a line of the traceback (not with the error line's newline).
        rank: the failing rank's `[rankN]:` tag number: lines tagged with another rank are not its traceback's.
    """
    cut = len(before) > CONTEXT
    lines = before[-CONTEXT:].decode("utf-8", "replace").split("\n")
    lines = lines[1 if cut else 0 : None if whole else -1]
    lines = [clean(line) for line in lines]
    if rank is not None:
        lines = [line for line in lines if (tag := _RANK_TAG.search(line)) is None or tag[1] == rank]
    for i in range(len(lines) - 1, -1, -1):
        if _TRACEBACK in lines[i]:
            return [lines[i]] + [line for line in lines[i + 1 :] if line.strip()]
    return lines


def _forward(before: bytes) -> list[str]:
    """The lines of anomaly mode's last warning in `before` after its header, log prefixes removed."""
    return [strip_prefix(line) for line in anomaly.forward_lines(before, clean)]


def _context(raw: list[str]) -> list[str]:
    """The traceback's lines as Python printed them: log prefixes gone, its header alone on its line."""
    return [_TRACEBACK if _TRACEBACK in line else strip_prefix(line) for line in raw]


def scan(chunks: Iterable[bytes], origin: str = "traceback") -> Found | None:
    """What the log whose bytes are `chunks`, in order, says (None: no Megatron error, verdict or traceback).

    Raises:
        UserError: an error line with a number more digits long than any Megatron prints.
    """
    scanner = _Scanner(origin)
    for chunk in chunks:
        scanner.feed(chunk)
    return scanner.finish()


def read_log(path: str, what: str = "traceback") -> Found | None:
    """`scan` of the file at `path`, which must be a regular file (of any size; gzip-compressed or UTF-16 too:
    launch.logsource), or of standard input ("-").

    Raises:
        UserError: not a regular file, unreadable, a closed standard input, or one line with an impossible number and
            nothing else read.
    """
    chunks, notes, handle = open_log(path, what)
    try:
        found = scan(chunks, "standard input" if path == STDIN else str(path))
    finally:
        if handle is not None:
            handle.close()
    if found is not None:
        found.notes = notes + found.notes
    elif notes:  # nothing read: say what the file was
        raise UserError(f"{path}: {notes[0]}, and nothing in it is a NaN report nanscope reads")
    return found
