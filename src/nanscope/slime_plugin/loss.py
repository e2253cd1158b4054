"""The plugin's loss: the running slime release's own policy loss, made NaN-safe around the call.

    --loss-type custom_loss --custom-loss-function-path nanscope.slime_plugin.policy_loss

`policy_loss` calls the policy_loss_function of the slime release that runs it (identified and checked
once per process by `nanscope.loss.target.running()`) inside nanscope's guard (`nanscope.loss.guard`):
non-finite inputs neutralised and counted, every exp-bearing log-ratio clamped before exp, masks that
select instead of multiply. The metrics are the release's own.

The guard's counters (tokens and samples dropped, exp overflows prevented) go where they cost no host read:

    with the hook installed  onto the hook's record of the micro-batch (`loss_watch.Seen.counts`): the step adds
                             them up on the device and logs them once, as nanscope/nan_guard/*, through its vote
                             (`step_vote.Counters`)
    the loss alone           into the metrics as nan_guard/* (0-dim device tensors), as before the hook took them:
                             slime's packing (`torch.tensor([n] + list(log.values()), device=...)`) reads each one to
                             the host, one sync per counter per micro-batch (docs/costs.md)
"""

from __future__ import annotations

from nanscope.loss import guard
from nanscope.slime_plugin.state import installation


def policy_loss(args, batch, logits, sum_of_sample_mean):
    """slime's custom-loss entry point: the running release's policy loss, NaN-safe.

    slime v0.1.0 calls it with keywords, v0.2 and later positionally or through
    torch.utils.checkpoint (--recompute-loss-function: the recomputation finds the micro-batch's record and
    replaces its counts with the same ones); NANSCOPE_NAN_POLICY (drop | strict, read once into the installation's
    settings) picks what happens to a non-finite input.

    Returns:
        (loss, metrics): the release's loss and metrics (plus nan_guard/* counters without the hook).
    """
    state = installation()
    target = state.target()
    with state.observing(args, batch) as seen:
        loss, metrics, counts = guard.guarded(
            target, args, batch, logits, sum_of_sample_mean, nan_policy=state.settings.nan_policy
        )
        if seen is None:  # the loss alone: no step to carry them
            metrics.update(guard.counter_metrics(counts, target.release.reads(args)))
        else:
            seen.loss, seen.counts = loss.detach(), counts
    return loss, metrics
