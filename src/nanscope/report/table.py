"""A table that keeps every word whole: rich's Table where each column fits its longest word, else each row as a
block of lines (its first column and cell, `hazard kl-exp-overflow`, then `column: value` below it, indented), as
scan's narrow listing does.

    table.render("nanscope repro: ...", ("hazard", "as-is (slime v0.1.0)", ...), rows, console)

`rows` holds each row's cells as rich markup (a red UNEXPECTED). In an 80-column terminal the repro matrix's seven
columns left hazard names cut mid-word ("kl-exp-o" / "verflow"); laid out as blocks, they are whole.
"""

from __future__ import annotations

from rich.padding import Padding
from rich.table import Table
from rich.text import Text

BORDER = 3  # columns a cell takes besides its text: its padding (1 + 1) and one border; the table 1 more


def _widest(columns: tuple[str, ...], rows: list[tuple[str, ...]], measure) -> list[int]:
    """`measure` of each column's widest text, over its header and its cells."""
    return [max(measure(text) for text in [column] + [row[i] for row in rows]) for i, column in enumerate(columns)]


def _words(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[int]:
    """Each column's longest word."""
    return _widest(columns, rows, lambda markup: max(map(len, Text.from_markup(markup).plain.split()), default=0))


def _widths(columns: tuple[str, ...], rows: list[tuple[str, ...]], width: int) -> list[int]:
    """Each column's text width in a table `width` wide: its longest word, and of the room left a share by how much
    more its longest line would take (rich's own squeeze cuts words: it shrinks the widest columns first)."""
    words, lines = _words(columns, rows), _widest(columns, rows, lambda markup: len(Text.from_markup(markup).plain))
    spare, wants = width - needed(columns, rows), [line - word for line, word in zip(lines, words, strict=True)]
    if sum(wants) <= spare:
        return lines
    return [word + spare * want // sum(wants) for word, want in zip(words, wants, strict=True)]


def needed(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> int:
    """The console width at which no header or cell has a word cut: each column's longest word, plus borders."""
    return sum(width + BORDER for width in _words(columns, rows)) + 1


def render(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]], console) -> None:
    """`rows` under `columns` as a table where the console is wide enough (`needed`), else as blocks of lines."""
    if needed(columns, rows) <= console.width:
        table = Table(title=title)
        for column, width in zip(columns, _widths(columns, rows, console.width), strict=True):
            table.add_column(column, overflow="fold", width=width)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    console.print(title, highlight=False, markup=False)
    for first, *cells in rows:
        console.print(Text(f"{columns[0]} " if columns[0] else "") + Text.from_markup(first), highlight=False)
        for column, cell in zip(columns[1:], cells, strict=True):
            if Text.from_markup(cell).plain:
                console.print(Padding(Text(f"{column}: ") + Text.from_markup(cell), (0, 0, 0, 2), expand=False))
