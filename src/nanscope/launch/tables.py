"""Column tables in a log: a notebook's or a Markdown progress table, read by column.

    Step | Training Loss | reward | reward_std | kl | entropy          <- the header (the line before the rule)
    -- | -- | -- | -- | -- | --                                        <- the rule
    1 | -0.283600 | 13.437500 | 21.810942 | nan | 0                   <- a row: (Step, 1), (Training Loss, -0.2836), ...
    2 | -0.149100 | 6.931818 | 14.526671 | nan | No Log               <- 'No Log' and empty cells are no value

The transformers notebook callback writes its table this way (`Step | Training Loss | Validation Loss | ...`), and
so does a Markdown table pasted from it. A row is read only with the table's number of cells, each a number, a
NaN/Inf word or an empty value.

    table = header(previous_line, rule_line)      # None: not a table's header and rule
    table = header(previous_line, rule_line, ["Loss of each run:"])   # columns that name runs: `run/Loss` keys
    found = table.row(line)                       # [(column, value, offset)] or None
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nanscope.facts.metric_names import METRIC_WORDS, is_step_key

MAX_COLUMNS = 64
_RULE = re.compile(r"\s{0,4}\|?\s{0,4}:?-{2,40}:?\s{0,4}(?:\|\s{0,4}:?-{2,40}:?\s{0,4}){1,63}\|?\s{0,4}")
_CELL = re.compile(r"[-+]?(?:\d[\d.,]{0,40}(?:[eE][-+]?\d{1,4})?|nan(?:\.0)?|inf(?:inity)?)", re.IGNORECASE)
_EMPTY = ("", "no log", "-", "n/a", "none")


def _cells(line: str) -> list[str]:
    text = line.strip()
    if text.startswith("|"):
        text = text[1:]
    if text.endswith("|"):
        text = text[:-1]
    return [cell.strip() for cell in text.split("|")][: MAX_COLUMNS + 1]


def is_rule(line: str) -> bool:
    """`-- | --` or `|---|---|`: a Markdown table's rule row."""
    return "|" in line and _RULE.fullmatch(line[:4096]) is not None


@dataclass(frozen=True)
class Table:
    """A table's columns, from its header; `metric`: the one its caption names where no column names one (the columns
    then name runs or settings compared, each cell that metric's value: its key is `column/metric`; where nothing
    names one, the key says so)."""

    columns: tuple[str, ...]
    metric: str | None = None
    unnamed: str = ""  # said after a column's name where neither the header nor a caption names a metric

    def key(self, column: str) -> str:
        """The metric key a column's cells are read under."""
        return column if is_step_key(column) else f"{column}/{self.metric}" if self.metric else column + self.unnamed

    def row(self, line: str) -> list[tuple[str, str, int]] | None:
        """(column, value, offset) of each cell of a row of this table that holds a value; None: not its row."""
        if line.count("|") < len(self.columns) - 1:
            return None
        cells = _cells(line)
        if len(cells) != len(self.columns):
            return None
        out, at = [], 0
        for column, cell in zip(self.columns, cells):
            at = line.find(cell, at) if cell else at
            if cell.lower() in _EMPTY:
                continue
            if _CELL.fullmatch(cell) is None:
                return None
            out.append((self.key(column), cell, max(at, 0)))
        return out


def header(line: str, rule: str, caption: list[str] = ()) -> Table | None:
    """The table whose header is `line` and whose rule row is `rule` (None: not one); `caption`: the lines before the
    header, read for the metric when no column names one (the last that names one, within the last two lines)."""
    if not is_rule(rule) or "|" not in line:
        return None
    columns = _cells(line)
    if not 2 <= len(columns) <= MAX_COLUMNS or len(columns) != len(_cells(rule)):
        return None
    if any(not column or _CELL.fullmatch(column) for column in columns):
        return None
    if any(METRIC_WORDS.search(column) for column in columns):
        return Table(tuple(columns))
    named = [found[-1] for text in caption[-2:] if (found := METRIC_WORDS.findall(text[:400]))]
    return Table(tuple(columns), named[-1] if named else None, "" if named else " (a column that names no metric)")
