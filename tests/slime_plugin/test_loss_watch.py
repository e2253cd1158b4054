"""The loss watch observes only: slime's loss, gradient and metrics are bitwise those without it, and it keeps the
current policy's log-probs as the release computed them, for the current step only."""

import pytest
import torch

from nanscope import case, hazards
from nanscope.loss import as_is, microbatch, target
from nanscope.loss.microbatch import Parallel
from nanscope.slime_plugin.loss_watch import LossWatch


def through_loss(name: str, watched: bool):
    policy = hazards.synthetic_policy(512, 0)
    batch = hazards.build(name, policy, case.rollout(512, 0), 0)
    batch.pop("hazard_site")
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    watch = LossWatch(target.model()) if watched else None
    try:
        loss, _, log = as_is.loss_function(case.args(global_batch_size=8), batch, 1, logits, parallel=Parallel())
        loss.backward()
    finally:
        if watch is not None:
            watch.remove()
    return loss.detach(), logits.grad, log["values"], watch, batch, logits


@pytest.mark.parametrize("name", ["healthy", "kl-exp-overflow", "nan-rollout-logprob"])
def test_the_release_loss_is_bitwise_unchanged_under_the_watch(name):
    plain, watched = through_loss(name, False), through_loss(name, True)
    for a, b in zip(plain[:3], watched[:3]):
        assert torch.equal(a.nan_to_num(nan=7.0), b.nan_to_num(nan=7.0)) and torch.equal(a.isnan(), b.isnan())


def test_it_keeps_the_current_log_probs_the_helper_computed():
    loss, _, _, watch, batch, logits = through_loss("healthy", True)
    (seen,) = watch.seen
    logp, ent = microbatch.log_probs_and_entropy(logits.detach(), batch, case.args().rollout_temperature, Parallel())
    assert seen.batch is batch and torch.equal(seen.logp, logp) and torch.equal(seen.entropy, ent)
    assert not seen.logp.requires_grad and torch.equal(seen.loss, as_is_policy_loss(batch, logits))


def as_is_policy_loss(batch, logits):
    ssm = microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False)
    loss, _ = as_is.policy_loss(case.args(global_batch_size=8), batch, logits.detach(), ssm, parallel=Parallel())
    return loss


def test_remove_restores_the_module_and_begin_forgets_the_step():
    originals = (as_is.policy_loss, as_is.log_probs_and_entropy)
    watch = LossWatch(target.model())
    assert (as_is.policy_loss, as_is.log_probs_and_entropy) != originals
    with watch.observing(None, {}):
        pass
    assert len(watch.seen) == 1
    watch.begin()
    assert watch.seen == []
    watch.remove()
    assert (as_is.policy_loss, as_is.log_probs_and_entropy) == originals
