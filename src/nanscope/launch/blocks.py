"""rsl-rl's block of key-a-line metrics under its `Learning iteration N/M` header is one record: the non-finite
values on its later lines join the first one read, whose model and pointer they may change (a value-function loss
first in the block's order beside a NaN surrogate loss is no sign the critic went first: holdout25 09).

    Learning iteration 17/50000
      Mean value_function loss: nan      <- the first reading (line 6)
           Mean surrogate loss: nan      <- the same record: joined, the model no longer the critic alone

    fold(first, block, number, values)   # True: the line's values joined the first reading
"""

from __future__ import annotations

from nanscope.launch.line_shapes import BLOCK_LINES
from nanscope.launch.loop_counters import spelled_model
from nanscope.launch.metric_points import model_of, points_to, shared_input

_BLOCK = "the block it is in"  # how a reading's step came from its block's header (launch.metric_lines)


def opening(first, headers: int) -> bool:
    """The first reading lies in the input's first block (`headers`: the block headers read so far): the text starts
    at its iteration, and an earlier one may have been non-finite too."""
    return (first.step_from or "").startswith(_BLOCK) and headers == 1


def step_from(block: tuple[int, int]) -> str:
    """How a reading's step came from rsl-rl's block `block` ((its iteration, its header's line))."""
    return f"{_BLOCK} (line {block[1]}: `Learning iteration {block[0]}/...`)"


def header_line(first) -> int | None:
    """The line of the rsl-rl block header the first reading `first` took its step from (None: no block's)."""
    how = "" if first is None else first.step_from or ""
    if not how.startswith(_BLOCK):
        return None
    return int(how.split("(line ", 1)[1].split(":", 1)[0])


def fold(first, block: tuple[int, int] | None, number: int, values: list[tuple[str, str]]) -> bool:
    """Join the non-finite `values` of line `number` to the first reading `first` (launch.readings.Reading) where
    both lie in rsl-rl's block `block` ((its iteration, its header's line)); True if so."""
    if block is None or not (first.step_from or "").startswith(_BLOCK) or first.line < block[1]:
        return False
    if not 0 < number - block[1] <= BLOCK_LINES:
        return False
    first.values += [pair for pair in values if pair not in first.values]
    keys = [key for key, value in first.values if value != "missing"]
    models = {model_of([key], {key.lower()}) or spelled_model(key) for key in keys} - {None}
    first.model = next(iter(models)) if len(models) == 1 else None  # several models' losses: none of them alone
    first.points_to = shared_input(models) if len(models) > 1 else points_to(first.values, first.finite, first.model)
    return True
