"""Small text formatters shared by the report renderers."""

from __future__ import annotations


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
