"""Lines of one evidence kind that carry one time stamp: several processes printing one step's line at once, where
the lines repeat one message (their numbers aside: `Rank 6`, `(2/4)`), not one process's several messages of one
event (DeepSpeed's `Grad overflow on iteration`, `Reducing dynamic loss scale`, `loss scale overflow!` in one
millisecond: holdout12 11).

    2023-03-06 12:41:16,652 WARNING [trainer.py:680] (2/4) Grad scale is small: 0.0    ranks 2 and 0 of 4, at once
    2023-03-06 12:41:16,652 WARNING [trainer.py:680] (0/4) Grad scale is small: 0.0    (icefall's prefix)

    stamps = Stamps(); stamps.add(signal_id, line_text, first=True) ...; stamps.same(signal_id, lines) -> Stamped
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# a logger's time stamp at a line's start, to the millisecond (`2025-04-27 17:00:18,438`, `[2024-07-17 19:44:06,829]`)
_STAMP = re.compile(r"\[?(?P<stamp>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d{3,6})")
# icefall's logger prints `(rank/world)` after the file and line (k2-fsa/icefall 36e0420 icefall/utils.py:183)
_RANK_OF = re.compile(r"\] \((?P<rank>\d{1,6})/(?P<world>\d{1,6})\) ")
_DIGITS = re.compile(r"\d+")
MAX_RANKS = 8  # ranks kept, whatever the lines


@dataclass
class Stamped:
    """The first line's time stamp, its message with numbers blanked, how many lines repeat both, and the ranks their
    `(rank/world)` prefixes name."""

    stamp: str
    shape: str
    count: int = 1
    ranks: list[int] = field(default_factory=list)
    world: int | None = None


@dataclass
class Stamps:
    """Per evidence kind, its first line's time stamp and the lines that repeat it (bounded: one record a kind)."""

    kinds: dict[str, Stamped] = field(default_factory=dict)

    def add(self, signal: str, text: str, *, first: bool) -> None:
        """A line of `signal` (`first`: the first of its kind)."""
        stamp = _STAMP.match(text)
        if stamp is None:
            return
        shape = _DIGITS.sub("#", _RANK_OF.sub("] ", text[stamp.end() :]))
        seen = self.kinds.get(signal)
        if seen is None and first:
            seen = self.kinds[signal] = Stamped(stamp["stamp"], shape)
        elif seen is not None and (stamp["stamp"], shape) == (seen.stamp, seen.shape):
            seen.count += 1
        else:
            return
        rank = _RANK_OF.search(text[:300])
        if rank is not None and len(seen.ranks) < MAX_RANKS and int(rank["rank"]) not in seen.ranks:
            seen.ranks.append(int(rank["rank"]))
            seen.world = int(rank["world"])

    def same(self, signal: str, lines: int) -> Stamped | None:
        """The stamp every one of `signal`'s `lines` lines carries with one message, where there are several."""
        seen = self.kinds.get(signal)
        return seen if seen is not None and seen.count > 1 and seen.count == lines else None
