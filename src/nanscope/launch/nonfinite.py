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

from nanscope.launch.metric_lines import MetricLines, pairs
from nanscope.launch.signals import Hit, read_line

MAX_RANKS = 64  # waiting ranks (NCCL's watchdog) kept
# literals (lowered) of a line worth reading besides its NaN/Inf words: the evidence lines' that hold none
# (launch.signals.MARKERS less those with a NaN/Inf word), a progress bar's, Megatron's iteration line, skip counters
NEEDLES = (
    b"overflow",
    b"already at minimum",
    b"error detected in",
    b"device-side assert",
    b"assertion `",
    b"watchdog caught collective",
    b"/it",
    b"it/s",
    b"consumed samples",
    b"skipped iterations",
    b"skipped=",
)
# fmt: skip
_LOWER = range(97, 123)
_ITERATION = re.compile(r"\biteration\s{1,20}\d")
_MEGATRON = ("Unexpected result", " in local grad norm", " in local forward loss", "rerun: unexpected result")
_WATCHDOG_RANK = re.compile(r"rank (\d{1,9}) waited")


CONTEXT_LINES = 4  # lines read before a candidate line, until the first non-finite metric line: their steps, keys


def _before(block: bytes, start: int, count: int) -> list[bytes]:
    """Up to `count` lines of `block` before the line that starts at `start`, in order."""
    out, end = [], start - 1
    while end > 0 and len(out) < count:
        begin = block.rfind(b"\n", 0, end) + 1
        out.append(block[begin:end][:4096])
        end = begin - 1
    return out[::-1]


STALE_WITHIN = 20  # lines after an overflow where the next logged grad_norm is the skipped step's


def _grad_norm(lines: list[str]) -> str | None:
    """The last grad_norm value `lines` print (as printed)."""
    found = None
    for line in lines:
        for key, value, _ in pairs(line):
            if key.lower().rsplit("/", 1)[-1] == "grad_norm":
                found = value.strip("'\"")
    return found


def _unwrapped(text: str, before: str) -> str:
    """A `|`-field line that continues the one before it (a terminal or a log viewer wrapped Megatron's iteration
    line): the two as one; else `text`."""
    if " | " in before and _ITERATION.search(before) and not _ITERATION.search(text) and "|" in text:
        return before.rstrip() + " " + text.strip()
    return text


def candidate_starts(block: bytes, extra: tuple[bytes, ...] = ()) -> list[int]:
    """The starts of the lines of `block` worth reading (and of those holding an `extra` literal), ascending. Literal
    searches in the lowered block, each line taken once per needle: linear in the block."""
    starts, low = set(), block.lower()
    for needle in (b"nan", b"inf"):
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
    for needle in NEEDLES + extra:
        at = low.find(needle)
        while at >= 0:
            starts.add(low.rfind(b"\n", 0, at) + 1)
            end = low.find(b"\n", at)
            at = -1 if end < 0 else low.find(needle, end)
    return sorted(starts)


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
    overflow: tuple[int, str | None] | None = None  # the last DeepSpeed overflow: its line, the grad_norm before it
    stale: tuple[int, str, str | None] | None = None  # the grad_norm logged after it: (line, value, the one before)

    def block(self, block: bytes, lines_before: int, clean) -> list[tuple[int, Hit]]:
        """Read the lines of `block` worth reading (`clean`: a raw line as a terminal shows it); the fatal hits that
        are the first of their log, with the offset of their line."""
        out, counted, lines = [], 0, lines_before
        extra = (b"grad_norm",) if self.overflow is not None and self.stale is None else ()
        for start in candidate_starts(block, extra):
            lines += block.count(b"\n", counted, start)
            counted = start
            end = block.find(b"\n", start)
            text = clean(block[start : len(block) if end < 0 else end].decode("utf-8", "replace"))
            if any(marker in text for marker in _MEGATRON):
                continue  # Megatron's own error and verdict lines are launch.failure's and launch.rerun's
            previous = b""
            if start > 0:  # the line before, for a line a terminal wrapped (the block's first: not at hand)
                previous = block[block.rfind(b"\n", 0, start - 1) + 1 : start - 1][-300:]
            following = b"" if end < 0 else block[end + 1 : end + 301].split(b"\n", 1)[0]
            hit = read_line(
                text, lines + 1, clean(previous.decode("utf-8", "replace")), clean(following.decode("utf-8", "replace"))
            )
            if hit is not None and hit.signal.id == "deepspeed-overflow":
                before = [clean(raw.decode("utf-8", "replace")) for raw in _before(block, start, CONTEXT_LINES)]
                self.overflow = (hit.line, _grad_norm(before))
                self._after_overflow(block, start, lines + 1, clean)
            elif hit is None and self.overflow is not None and self.stale is None:
                self._stale(text, lines + 1)
            if hit is None:
                if self.metrics.first is None:  # the metric lines just before it: their steps and keys
                    self.metrics.context(_before(block, start, CONTEXT_LINES), clean)
                self.metrics.feed(_unwrapped(text, clean(previous.decode("utf-8", "replace"))), lines + 1)
                continue
            self.metrics.bars(text, lines + 1)
            if self.metrics.first is None and hit.signal.id not in self.first:  # the metric lines before it
                self.metrics.context(_before(block, start, CONTEXT_LINES), clean)
            if self._keep(hit):
                out.append((start, hit))
        return out

    def _after_overflow(self, block: bytes, start: int, number: int, clean) -> None:
        """The first grad_norm after the overflow line at `start` in the same block (one in a later block is a
        candidate line there)."""
        end = block.find(b"\n", start)
        at = -1 if end < 0 else block.find(b"grad_norm", end)
        if at >= 0 and self.stale is None:
            begin = block.rfind(b"\n", 0, at) + 1
            stop = block.find(b"\n", at)
            line = clean(block[begin : len(block) if stop < 0 else stop].decode("utf-8", "replace"))
            self._stale(line, number + block.count(b"\n", start, begin))

    def _stale(self, text: str, number: int) -> None:
        """The grad_norm of the first metric line after a DeepSpeed overflow: the skipped step's is the previous one's
        (DeepSpeed ZeRO returns from step() on an overflow before it computes the norm: stage_1_and_2.py:1839-1853
        at 0.16.4, so get_global_grad_norm() still holds the last step's)."""
        value = _grad_norm([text])
        line, before = self.overflow
        if value is not None and number - line <= STALE_WITHIN:
            self.stale = (number, value, before)

    def _keep(self, hit: Hit) -> bool:
        """Count `hit`; True when it is the log's first fatal one."""
        signal = hit.signal
        timeout = signal.id == "nccl-timeout"  # it fires a timeout after the step that failed: no step of its own
        if hit.step is None and not timeout and self.metrics.bar is not None and hit.line - self.metrics.bar_line <= 2:
            hit.step = self.metrics.bar  # the progress bar on its line, or just before it
        self.counts[signal.id] = self.counts.get(signal.id, 0) + 1
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
        return False

    def softest(self) -> Hit | None:
        """The first non-fatal hit (a skipped step, a warning), when nothing fatal was met."""
        soft = [hit for hit in self.first.values() if not hit.signal.fatal]
        return min(soft, key=lambda hit: hit.line) if soft else None

    def to_dict(self) -> dict:
        return {
            "signals": [
                {"check": hit.signal.id, "line": hit.line, "count": self.counts[key], "rank": hit.rank,
                 "step": hit.step, "op": hit.op, "detail": hit.detail, "text": hit.text}
                for key, hit in self.first.items()
            ],
            "waiting_ranks": sorted(self.waiting),
            "stale_grad_norm": None if self.stale is None else
            {"line": self.stale[0], "value": self.stale[1], "before_overflow": self.stale[2]},
        }  # fmt: skip
