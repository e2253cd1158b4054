"""The plugin's loss: the running slime release's own policy loss, made NaN-safe around the call.

    --loss-type custom_loss --custom-loss-function-path nanscope.slime_plugin.policy_loss

`policy_loss` calls the policy_loss_function of the slime release that runs it (identified and checked
once per process by `nanscope.loss.target.running()`) inside nanscope's guard (`nanscope.loss.guard`):
non-finite inputs neutralised and counted, every exp-bearing log-ratio clamped before exp, masks that
select instead of multiply. The metrics are the release's own plus `nan_guard/*` counters.
"""

from __future__ import annotations

from nanscope.loss import guard
from nanscope.slime_plugin.state import installation


def policy_loss(args, batch, logits, sum_of_sample_mean):
    """slime's custom-loss entry point: the running release's policy loss, NaN-safe.

    slime v0.1.0 calls it with keywords, v0.2 and later positionally or through
    torch.utils.checkpoint (--recompute-loss-function); NANSCOPE_NAN_POLICY (drop | strict, read once
    into the installation's settings) picks what happens to a non-finite input.

    Returns:
        (loss, metrics): the release's loss and metrics plus nan_guard/* counters.
    """
    state = installation()
    with state.observing(args, batch) as seen:
        loss, metrics = guard.call(
            state.target(), args, batch, logits, sum_of_sample_mean, nan_policy=state.settings.nan_policy
        )
        if seen is not None:
            seen.loss = loss.detach()
    return loss, metrics
