"""The plugin's loss: slime's custom-loss entry point, `--custom-loss-function-path nanscope.slime_plugin.policy_loss`."""

from __future__ import annotations

import os

from nanscope.loss import safe

# The micro-batches the loss saw on this rank in the current step (slime keeps them alive anyway;
# logits are not kept: on the case's model they are ~10 GB per micro-batch). Module-level because
# slime calls the loss and the hook separately; the hook clears it at each step.
_step_microbatches: list[dict] = []


def policy_loss(args, batch, logits, sum_of_sample_mean):
    """slime's custom-loss entry point: the safe policy loss (see nanscope.loss.safe).

    slime v0.1.0 calls it with keyword arguments from its loss_function and then scales the loss
    and packs the metrics itself. The parallel layout (TP group, CP rank/size) comes from
    megatron-core's parallel state.

    Returns:
        (loss, metrics): slime's policy-loss metrics plus nan_guard/* counters.
    """
    _step_microbatches.append(batch)
    nan_policy = os.environ.get("NANSCOPE_NAN_POLICY", "drop")
    return safe.policy_loss(args, batch, logits, sum_of_sample_mean, nan_policy=nan_policy)
