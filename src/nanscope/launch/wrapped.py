"""A Megatron iteration line wrapped over several lines (a terminal, a log viewer or the user broke it at `|`, or
mid-word at the terminal's width), joined back into one.

    iteration 5/50 | elapsed time per iteration: 21392.5 ms |          <- its head: `iteration N`
    learning rate: 1.350000E-04 | global batch size: 4096 |            <- pieces: `key: value |` fields
    loss scale: 1.0 | grad norm: nan |
    number of skipped iterations: 0 | number of nan iterations: 0     <- its last field ends it

A line of `|` fields without `iteration N` is a piece when a head is at most MAX_PIECES lines above it, every line
between being a piece too; the record runs on while pieces follow, up to the field that ends Megatron's line (or a
blank line, another head, MAX_PIECES lines). A complete line (it has its last field) is never joined with the next
one: Megatron's own timer line (`time (ms) | forward-compute: ...`) stays apart. A piece that ends inside a word and
a next one that starts inside it are joined without a space (a hard wrap at the terminal's width loses no
character).

    text, end, first = record(block, start, end, clean)   # the joined record around the line at start:end,
                                                         # where it ends, where its first line starts

A Python dict a paste broke over lines (transformers' Trainer's log line, cut at a fixed width, mid-word:
`'rewards/strict_format_re` / `ward_func': 0.0`, holdout22 01) is joined the same way by `dict_record`, from the
line that opens it (`{'`) to the one that closes it (`}`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MAX_PIECES = 8  # lines of one record
_REACH = 64 * 1024  # bytes before a piece where its head must start
_HEAD = re.compile(r"\biteration\s{1,20}\d")
_PIECE = re.compile(r"[A-Za-z][\w ./()-]{0,80}:\s{0,20}[-+\d.na]")
_LAST = ("nan iterations", "skipped iterations")


def _piece(text: str) -> bool:
    return "|" in text and _PIECE.search(text, 0, 2048) is not None and _HEAD.search(text, 0, 2048) is None


def _lines_before(block: bytes, start: int, count: int) -> Iterator[tuple[int, int]]:
    """(start, end) of up to `count` lines before the one at `start`, nearest first (as the caller walks back)."""
    end = start - 1
    while end > 0 and count > 0:
        begin = block.rfind(b"\n", 0, end) + 1
        yield begin, end
        end, count = begin - 1, count - 1


def _lines_after(block: bytes, end: int, count: int) -> list[tuple[int, int]]:
    out, at = [], end + 1
    while 0 < at < len(block) and len(out) < count:
        stop = block.find(b"\n", at)
        stop = len(block) if stop < 0 else stop
        out.append((at, stop))
        at = stop + 1
    return out


def _join(pieces: list[str]) -> str:
    out = pieces[0]
    for piece in pieces[1:]:
        glued = out[-1:].isalnum() and piece[:1].isalnum()  # cut inside a word at the terminal's width
        out = out.rstrip() + ("" if glued else " ") + piece.strip()
    return out


def record(block: bytes, start: int, end: int, clean) -> tuple[str, int, int]:
    """The Megatron record the line at block[start:end] belongs to, joined, the offset where it ends and the offset
    where its first line starts; the line itself (`end`, `start`) when it is no wrapped record's part. `clean`: a
    decoded line as a terminal shows it."""
    text = clean(block[start:end].decode("utf-8", "replace"))
    lines, first = [text], start
    if not _HEAD.search(text, 0, 2048):
        if not _piece(text) or block.rfind(b"iteration", max(0, start - _REACH), start) < 0:
            return text, end, start  # no head within reach: a literal search, not a walk back
        head = None
        for begin, stop in _lines_before(block, start, MAX_PIECES):
            before = clean(block[begin:stop].decode("utf-8", "replace"))
            if "|" not in before:
                return text, end, start
            if _HEAD.search(before, 0, 2048):
                head, first = before, begin
                break
            if any(last in before for last in _LAST) or _PIECE.search(before, 0, 2048) is None:
                return text, end, start
            lines.insert(0, before)
        if head is None:
            return text, end, start
        lines.insert(0, head)
    elif "|" not in text:
        return text, end, start
    if any(last in " ".join(lines) for last in _LAST):
        return _join(lines), end, first
    for begin, stop in _lines_after(block, end, MAX_PIECES):
        after = clean(block[begin:stop].decode("utf-8", "replace"))
        if not after.strip() or not _piece(after):
            break
        lines.append(after)
        end = stop
        if any(last in after for last in _LAST):
            break
    return _join(lines), end, first


def _opens(text: str) -> bool:
    """The line opens a dict it does not close (`{'loss': 0.0, ... 'rewards/strict_format_re`)."""
    at = text.rfind("{'", 0, 4096)
    return at >= 0 and "}" not in text[at:]


def dict_record(block: bytes, start: int, end: int, clean) -> tuple[str, int, int] | None:
    """The Python dict the line at block[start:end] is a piece of, joined, where it ends and where its first line
    starts; None: the line is a whole dict or no dict's piece."""
    text = clean(block[start:end].decode("utf-8", "replace"))
    lines, first = [text], start
    if not _opens(text):
        if "{" in text or "': " not in text or block.rfind(b"{'", max(0, start - _REACH), start) < 0:
            return None
        for begin, stop in _lines_before(block, start, MAX_PIECES):
            before = clean(block[begin:stop].decode("utf-8", "replace"))
            if "}" in before or not before.strip():
                return None
            lines.insert(0, before)
            if _opens(before):
                first = begin
                break
        else:
            return None
    if "}" in text and not _opens(text):
        return _join(lines), end, first
    for begin, stop in _lines_after(block, end, MAX_PIECES):
        after = clean(block[begin:stop].decode("utf-8", "replace"))
        if not after.strip() or "{" in after:
            break
        lines.append(after)
        end = stop
        if "}" in after:
            return _join(lines), end, first
    return None
