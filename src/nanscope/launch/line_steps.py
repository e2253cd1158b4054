"""The step a metric line names itself: a step key (`step: 30`, `iteration 12`, `global_step`), mmengine's and
MetricLogger's bracketed iteration, a step in brackets at its head, a stack's own spelling (launch.line_shapes):

    iter 16 step 1: loss nan, train time: 1410.54ms      16 (its iter; step 1 the optimizer's steps done)
    Epoch(train) [1][240/735]  lr: 1e-4  loss: nan       240 (the iteration within its epoch)

    step, how = named(piece, pairs(piece))    # (None, None): the line names none
"""

from __future__ import annotations

import math
import re

from nanscope.facts.metric_names import is_step_key
from nanscope.launch import line_shapes as shapes
from nanscope.launch.line_pairs import WINDOW

# mmengine's `Epoch(train) [1][240/735]` and `Iter(train) [ 510/2046]` (space-padded): the iteration
# and the MetricLogger of DeiT, BEiT, VideoMAE (`Epoch: [0]  [   10/17227]  eta: ...`: the iteration in its epoch)
_EPOCH_ITER = re.compile(
    r"\]\s{0,4}\[\s{0,12}(?P<step>\d{1,12})/\d{1,12}\]"
    r"|Iter(?:\((?:train|val|test)\))?\s{0,4}\[\s{0,12}(?P<iter>\d{1,12})/\d{1,12}\]"  # mmcv's `Iter [100/160000]`
)
# a step in brackets at a line's head (loguru's `mip.logger:log:94 - [Step 13999] total_time: ...`, dreamer's `[5000] `)
_BRACKET_STEP = re.compile(r"\[(?:step|iter|iteration)\s{1,4}(?P<step>\d{1,12})\]|\A\[(?P<at>\d{1,12})\] ", re.IGNORECASE)  # fmt: skip
LINE = "the line"  # how: its own step key
_ITER = "the line's iter, each micro-batch; "  # how: a micro-batch iteration beside the optimizer's count
ROUNDED = ", printed "  # how, after the source: the step printed rounded (`1.53e+05`), said as printed
BAR_BEFORE = "the progress bar before it"  # how: the count of the bar drawn before the line (it logs at or after it)
BAR_AFTER = "the progress bar after it"  # how, then the bar as shown: the count of the bar drawn after the line
# what a bar's count drawn before (after) a line says of the line's step
LAGS = "the progress bar drawn before it counts the steps done by then; the line was logged at or after that"
LEADS = "the progress bar drawn after it counts the steps done by then; the line was logged at or before that"
AT, AT_OR_BEFORE, AT_OR_AFTER = "at", "at or before", "at or after"  # what a step said of a line bounds


def bound(step: int | None, how: str | None, *, opening: bool) -> str | None:
    """How the step a metric line was given bounds its own (None: no step): the input's first record of its metric
    (`opening`) is at or before it, an earlier step maybe non-finite too; a progress bar's count drawn before the line
    is at or after it, one drawn after the line at or before it (a bar counts the steps done when it is drawn, and a
    pasted terminal may have lost the bars between); else at it."""
    if step is None:
        return None
    if opening and step > 1:
        return AT_OR_BEFORE
    if how == BAR_BEFORE:
        return AT_OR_AFTER
    return AT_OR_BEFORE if (how or "").startswith(BAR_AFTER) else AT


def bar_words(how: str | None) -> str | None:
    """What a progress bar a step was read from says of the line (None: the step is not a bar's)."""
    if how == BAR_BEFORE:
        return LAGS
    return LEADS if (how or "").startswith(BAR_AFTER) else None


def own(how: str | None) -> bool:
    """`how` says the step came from the line's own step key."""
    how = None if how is None else how.split(ROUNDED, 1)[0]
    return how == LINE or how is not None and how.startswith(_ITER)


def rounded(value: str) -> str | None:
    """`value` where it prints a step rounded: e-notation with fewer significant digits than the step's (baselines'
    logger prints 153021 as `1.53e+05`, '%-8.3g'); None: it prints the step exactly."""
    text = value.strip("'\"").lower()
    mantissa, e, exponent = text.partition("e")
    try:
        power = int(exponent) if e else -1
    except ValueError:
        return None
    digits = len(mantissa.lstrip("+-").replace(".", "").lstrip("0").rstrip("0")) or 1
    return text if power >= digits else None


def printed(how: str | None) -> str | None:
    """The step as printed, where `how` (a step's source) says it was rounded; None: exact."""
    if how is None or ROUNDED not in how:
        return None
    return how.split(ROUNDED, 1)[1].split(":", 1)[0]


def with_rounding(how: str, value: str) -> str:
    """`how`, saying the step was printed rounded where `value` is (launch.line_steps.rounded)."""
    shown = rounded(value)
    return how if shown is None else f"{how}{ROUNDED}{shown}: rounded, so not exact"


def named(piece: str, found: list[tuple[str, str, int]]) -> tuple[int | None, str | None]:
    """The step `piece` names (`found`: its key/value pairs) and how: a step key, mmengine's iteration, a bracketed
    step; (None, None): none."""
    steps = []  # (key, step) of each step key, in order
    for key, value, at in found:
        if is_step_key(key) and not shapes.percent(piece, at, value) and not shapes.setting(piece, at, key):
            count = number(value.split("/")[0])
            if count is not None and math.isfinite(count):
                steps.append((key, int(count), value))
    glob = next((pair for pair in steps if pair[0].lower() == "global_step"), None)
    if glob is not None and len(steps) > 1:  # `step: 4, global_step:1` (liucongg/ChatGLM-Finetuning#132): the
        other = next(pair for pair in steps if pair is not glob)  # optimizer's count, beside another count
        return glob[1], f"the line's global_step (its {other[0]} {other[1]} counts something else)"
    if steps:
        return steps[0][1], with_rounding(_optimizer_count([pair[:2] for pair in steps]), steps[0][2])
    match = _EPOCH_ITER.search(piece, 0, WINDOW)
    if match is not None and match["step"] is not None:
        return int(match["step"]), "the line (the iteration within its epoch)"
    if match is not None:
        return int(match["iter"]), LINE
    bracket = _BRACKET_STEP.search(piece, 0, WINDOW)
    if bracket is not None:
        return int(bracket["step"] or bracket["at"]), LINE
    return shapes.named_step(piece) or (None, None)


def _optimizer_count(steps: list[tuple[str, int]]) -> str:
    """How a line's first step key gives its step: the line, and the optimizer's count beside a micro-batch
    iteration (lit-gpt's `iter 16 step 1: loss nan`: step_count rises after each optimizer.step, iter_num each
    micro-batch: Lightning-AI/litgpt f16716a finetune/adapter.py train(); Lightning-AI/litgpt#185, holdout24 02)."""
    (first, count), rest = steps[0], steps[1:]
    done = next((n for key, n in rest if key.lower() == "step"), None)
    if first.lower() == "iter" and done is not None and done < count:
        return f"{_ITER}its step {done} counts the optimizer's steps done"
    return LINE


def number(value: str) -> float | None:
    """A printed value as a float, its quotes stripped (None: no number)."""
    try:
        return float(value.strip("'\""))
    except ValueError:
        return None
