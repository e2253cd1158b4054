"""Small text formatters shared by the report renderers."""

from __future__ import annotations

import textwrap


def span(values: list[int] | None, empty: str = "none", min_run: int = 1) -> str:
    """Integers as a range when they are consecutive, else listed.

    Args:
        values: e.g. decoder layers or the ranks of a group; None when unknown.
        empty: the text for an empty list.
        min_run: the fewest values written as a range (`3, 4` rather than `3-4` with 3).

    Returns:
        `72-93` for 72..93, `6, 7, 14, 15` otherwise, "unknown" for None.
    """
    if values is None:
        return "unknown"
    if not values:
        return empty
    if len(values) >= min_run and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ", ".join(map(str, values))


def fold(line: str, columns: int, *, cut_words: bool = False) -> list[str]:
    """`line` as lines of at most `columns`, broken between words, each after the first indented 4 past the line's
    own indent (a word wider than that stays whole, a path never cut, unless `cut_words`: a terminal, which would
    wrap it anyway)."""
    if len(line) <= columns:
        return [line]
    indent = line[: len(line) - len(line.lstrip(" "))]
    more = indent + "    " if len(indent) + 4 <= columns // 2 else "    "
    wrapper = textwrap.TextWrapper(
        columns, initial_indent=indent, subsequent_indent=more, break_long_words=cut_words, break_on_hyphens=False
    )
    return wrapper.wrap(line.lstrip(" ")) or [line]


def folded(text: str, columns: int, *, cut_words: bool = False) -> str:
    """`text`, each of its lines folded at `columns` (`fold`)."""
    return "\n".join(piece for line in text.split("\n") for piece in fold(line, columns, cut_words=cut_words))
