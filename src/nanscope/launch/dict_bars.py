"""A Trainer dict whose step was read from the progress bar just before it, and the next bar after it: which step
the dict logged. A bar redrawn after a dict repeats the dict's step (tqdm clears its bar to print a line, then draws
it again), so the bar after is the dict's step by default (launch.metric_lines); two shapes say otherwise:

    3/200   {dict}   6/200                the bar before's 3: a notebook keeps a bar's last state before each
                                          printed line, so the 6 is steps run since, no redraw (holdout20 07)
    0/20   {dict} x 5   5/20              one dict a step: the first is step 1 (holdout21 09); x 5 to 10/20: one
                                          every 2 steps, the first step 2; the first NaN the second dict (finite
                                          first): step 2 (holdout26 03)

The first only where the bar after is a notebook's (no `|` body: a terminal's tqdm redraws its bar at the dict's
step, and a bar before that lags is tqdm's mininterval skipping a draw: tqdm 4.67 std.py:1237-1240); both only where
the two bars are one loop's (the same total: an evaluation's bar before is not the training's,
holdout20 03); the first only where the dict is the first since the bar before (dicts between: that bar is stale,
holdout20 06).
"""

from __future__ import annotations


def ran_past(step: int, count: int, *, same_loop: bool) -> bool:
    """The bar after (at `count`) is 2 or more past the dict's bar before (at `step`): steps ran since, no redraw
    (a redraw repeats the count, or is one ahead where the bar before was stale)."""
    return same_loop and count - step >= 2


def one_a_step(step: int, count: int, dicts: int, nth: int, *, same_loop: bool) -> tuple[int, int] | None:
    """(the `nth` dict's step, the logging interval) where `dicts` dicts lie between the bars at `step` and `count`,
    one every k steps (a Trainer logs at the multiples of its logging_steps: `step` one of them); None: not so."""
    if not same_loop or dicts < 2 or not 0 < nth <= dicts or count <= step or (count - step) % dicts:
        return None
    every = (count - step) // dicts
    return (step + nth * every, every) if step % every == 0 else None
