"""Counted nouns in doctor's sentences: `1 node`, `2 nodes`, `1 process`, never `1 nodes`.

count(1, "node")                          # "1 node"
count(8, "process", "processes")          # "8 processes"
"""

from __future__ import annotations


def count(number: int | float, word: str, plural: str | None = None) -> str:
    """`number` and `word`, the plural where `number` is not 1 (`plural`, else `word` + "s")."""
    shown = f"{number:g}" if isinstance(number, float) else str(number)
    return f"{shown} {word if number == 1 else plural or word + 's'}"
