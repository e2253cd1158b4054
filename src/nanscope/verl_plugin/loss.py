"""verl's `nanscope` policy loss mode: the mode NANSCOPE_INNER_LOSS_MODE names (default vanilla), NaN-safe.

    actor_rollout_ref.actor.policy_loss.loss_mode=nanscope

verl looks a policy loss up by name in `POLICY_LOSS_REGISTRY` and calls it with keywords (verl v0.9.0
verl/trainer/ppo/core_algos.py:50-84, called from verl/workers/utils/losses.py:101-112):
(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights), [B, T] tensors
padded to the longest response, response_mask bool. `GuardedLoss` calls the inner mode, looked up in the same
registry on every call (a mode registered after the plugin is found), with the inputs guarded
(`nanscope.loss.padded`, each step's reason there):

    1. non-finite old_log_prob, advantages and rollout_is_weights entries become 0 and leave response_mask
    2. every log-ratio log_prob - old is clamped to [-20, 20] before the inner mode exponentiates it, masked tokens
       included (clip_cov, kl_cov and geo_mean take exp of it unclamped; gspo clamps its upper side only)
    3. masked advantages are 0, so verl's seq-mean-* aggregation (which multiplies by the mask) meets +-0 there,
       as a selection would give

On healthy data every trained entry keeps its bits and the inner mode runs op for op as without the plugin; its
loss and metrics are returned unchanged. The loss normalisation is the engine's: a token dropped here (1.) is
still counted in verl's `batch_num_tokens`; the engine's `train_batch` drops non-finite inputs from `loss_mask`
before that count is taken (`inputs`), so by the time the loss runs nothing is left to drop here.

What the guard measured (`padded.Headroom`) goes on the engine's record of the call (`record`), never into the
returned metrics: verl forces those to a MEAN and reads each to the host.
"""

from __future__ import annotations

from collections.abc import Callable

from nanscope.loss import padded
from nanscope.verl_plugin import record

NAME = "nanscope"


class GuardedLoss:
    """The `nanscope` loss mode (see the module docstring), registered in verl's policy-loss registry.

    Args:
        inner: the inner mode's name (NANSCOPE_INNER_LOSS_MODE).
        lookup: name -> policy loss function (verl's `get_policy_loss_fn`).
    """

    def __init__(self, *, inner: str, lookup: Callable):
        self.inner, self.lookup = inner, lookup

    def __call__(
        self,
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode: str = "token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        """verl's PolicyLossFn (core_algos.py:36-48): (loss, metrics) of the inner mode on the guarded inputs."""
        inner = self.lookup(self.inner)
        old, old_finite = padded.cleaned(old_log_prob)
        adv, adv_finite = padded.cleaned(advantages)
        bad = ~(old_finite & adv_finite)
        weights = rollout_is_weights
        if weights is not None:
            weights, weights_finite = padded.cleaned(weights)
            bad = bad | ~weights_finite
        mask = padded.masked_out(response_mask, bad)
        call = record.current()
        if call is not None:
            call.headroom = padded.headroom(old, log_prob)
            call.inputs = {"old_log_prob": old_log_prob, "log_prob": log_prob.detach(), "advantages": advantages,
                           "response_mask": response_mask}  # fmt: skip
            if rollout_is_weights is not None:
                call.inputs["rollout_is_weights"] = rollout_is_weights
        return inner(
            old_log_prob=padded.bounded_old(old, log_prob),
            log_prob=log_prob,
            advantages=padded.selected(adv, mask),
            response_mask=mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=weights,
        )
