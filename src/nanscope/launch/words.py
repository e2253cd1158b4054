"""Counted nouns in every command's sentences: `1 node`, `2 nodes`, `1 process`, never `1 nodes`.

count(1, "node")                          # "1 node"
count(8, "process", "processes")          # "8 processes"
count(2048, "sample", grouped=True)       # "2,048 samples"
"""

from __future__ import annotations


def count(number: int | float, word: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """`number` and `word`, the plural where `number` is not 1 (`plural`, else `word` + "s"); `grouped`: an int's
    thousands separated (2,048)."""
    shown = f"{number:g}" if isinstance(number, float) else f"{number:,}" if grouped else str(number)
    return f"{shown} {word if number == 1 else plural or word + 's'}"
