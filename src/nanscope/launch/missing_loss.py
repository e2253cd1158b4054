"""Megatron's iteration line without its loss: training_log prints an average loss only when it is > 0, so NaN is
left out (core_v0.15.0rc0 megatron/training/training.py training_log), and the line is weak evidence of a NaN loss.

    iteration 5/ 100 | consumed samples: 40 | lm loss: 2.01E+00 | loss scale: 1.0 | number of skipped iterations: 0 |
    iteration 6/ 100 | consumed samples: 48 | loss scale: 1.0 | number of skipped iterations: 0 |   -> lm loss missing

    missing = missing_loss(found, loss_keys)   # [("lm loss", "missing")], or []; loss_keys: the loss fields so far
"""

from __future__ import annotations

from nanscope.launch.line_steps import number
from nanscope.launch.scales import SKIP_COUNTER

ITERATION = ("consumed samples", "elapsed time per iteration (ms)", "elapsed time per iteration")


def missing_loss(found, loss_keys: set[str]) -> list[tuple[str, str]]:
    """The losses a Megatron iteration line's pairs `found` leave out (or, with `loss scale` and no skip, any loss),
    each as (key, "missing"); `loss_keys`: the loss fields its earlier lines printed, updated in place."""
    keys = {key.lower(): value for key, value, _ in found}
    if not any(key in keys for key in ITERATION):
        return []
    losses = {key for key in keys if key.endswith(" loss") and key != "loss scale"}
    if losses:
        loss_keys |= losses
        return []
    skipped = number(keys.get(SKIP_COUNTER, "0")) or 0
    if skipped > 0 or "loss scale" not in keys:
        return []
    return [(key, "missing") for key in sorted(loss_keys)] or [("lm loss", "missing")]
