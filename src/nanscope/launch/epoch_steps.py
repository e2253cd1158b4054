"""A per-line epoch counter as the step: a toy loop's `print("epoch:", epoch, "loss:", loss)`, one line per pass
over its data, so that each line's `epoch: N` is one more than the line before's:

    epoch: 3450 loss: 0.21063452526926987
    epoch: 3451 loss: nan                       <- step 3451: the counter rose by one on every line before it

An epoch that does not rise by one a line (several lines per epoch, a gap) says nothing of the step.

    values = counts(lines, clean)      # the `epoch: N` of each line just before a metric line (None: it has none)
    found = step(line, values)         # (N, how) where `line`'s counter continues theirs; None otherwise
    one_a_line(N, lines)               # False where the lines just before count epochs otherwise than one a line
"""

from __future__ import annotations

import re

WINDOW = 200  # characters of a line read: the counter leads it
_EPOCH = re.compile(r"(?<![\w/])epoch\s{0,2}[:=]?\s{0,2}(?P<n>\d{1,12})(?![\d/.])", re.IGNORECASE)
RUN = 3  # lines before, each one more than the last, that make the counter a per-line one


def _epoch(line: str) -> int | None:
    match = _EPOCH.search(line, 0, WINDOW)
    return None if match is None else int(match["n"])


def counts(lines: list[bytes], clean) -> list[int | None]:
    """The epoch counter of each line (raw bytes, `clean`: as a terminal shows it), in order."""
    return [_epoch(clean(raw.decode("utf-8", "replace"))) for raw in lines]


def step(line: str, before: list[int | None]) -> tuple[int, str] | None:
    """`line`'s epoch counter as its step, when the RUN lines before it each counted one more than the last and it
    counts one more again; None: no such counter."""
    now, last = _epoch(line), before[-RUN:]
    if now is None or len(last) < RUN or any(value is None for value in last):
        return None
    if any(b - a != 1 for a, b in zip(last, last[1:], strict=False)) or now != last[-1] + 1:
        return None
    return now, "the line (its epoch counter, one more on each line before it)"


def one_a_line(now: int, lines: list[str]) -> bool:
    """False where the epoch counters of `lines` (those just before a line counting epoch `now`, in order) repeat or
    skip: several lines per epoch, so the epoch is not the step. True where they rise by one to `now`, or none count."""
    counted = [value for value in (_epoch(line) for line in lines[-RUN:]) if value is not None]
    chain = counted + [now]
    return all(b - a == 1 for a, b in zip(chain, chain[1:], strict=False))
