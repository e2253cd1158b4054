"""The catalogue: each hazard gives its stated finiteness through slime v0.1.0's loss."""

import pytest
import torch

from nanscope import case, hazards
from nanscope.loss import as_is
from nanscope.loss.formulas import FP32_EXP_MAX
from nanscope.loss.microbatch import Parallel
from nanscope.slime_args import case_args


@pytest.mark.parametrize("name", [h.name for h in hazards.CATALOGUE])
def test_as_is_gives_the_stated_finiteness(name):
    h = hazards.get(name)
    o = hazards.run_loss(name, "as-is")
    assert (o.loss_finite, o.grad_finite) == (h.loss_finite, h.grad_finite)
    assert (o.nan_grad_entries == 0) == h.grad_finite


def test_unknown_name_lists_the_catalogue():
    with pytest.raises(ValueError, match="unknown hazard 'nope'; known: healthy, kl-exp-overflow"):
        hazards.get("nope")


def build(name, seed=0):
    policy = hazards.synthetic_policy(512, seed)
    return hazards.build(name, policy, hazards.case_rollout(512, seed), seed)


def test_batches_are_mutually_consistent():
    policy = hazards.synthetic_policy(512, 0)
    batch = build("healthy")
    # old log-probs are the policy's own log-probs of the tokens (one step per rollout)
    rollout = hazards.Rollout(batch["unconcat_tokens"], batch["response_lengths"], batch["loss_masks"], batch["rewards"])
    logp = hazards.policy_log_probs(policy(rollout.tokens), rollout, case.temperature())
    for old, x in zip(batch["log_probs"], logp):
        assert torch.equal(old, x)
    # tool-output tokens are masked and have rollout log-prob 0.0; model tokens are noisy copies
    for m, roll, old in zip(batch["loss_masks"], batch["rollout_log_probs"], batch["log_probs"]):
        assert (m == 0).any() and (roll[m == 0] == 0).all()
        assert roll.dtype == torch.bfloat16  # as slime's data path stores them
        # noise (std 0.02) plus bf16 rounding (half a spacing: |x| * 2^-8)
        assert ((roll.float() - old)[m == 1].abs() < 0.1 + old[m == 1].abs() * 2**-8).all()
    assert len(batch["response_lengths"]) == case.group_size()


def test_kl_trigger_comes_from_the_policy_logits():
    policy = hazards.synthetic_policy(512, 0)
    batch = build("kl-exp-overflow")
    i, j = batch["hazard_site"]
    assert batch["loss_masks"][i][j] == 0  # a masked tool-output token
    # the planted token is the vocabulary's least likely at that position under the policy
    total, response = batch["total_lengths"][i], batch["response_lengths"][i]
    row = policy(batch["unconcat_tokens"])[i][total - response - 1 + j]
    assert batch["unconcat_tokens"][i][total - response + j] == row.argmin()
    logp = batch["log_probs"][i][j]  # old == policy logp
    assert batch["ref_log_probs"][i][j] - logp > FP32_EXP_MAX


def test_ratio_trigger_is_masked_with_positive_advantage():
    batch = build("ratio-exp-overflow")
    i, j = batch["hazard_site"]
    assert batch["loss_masks"][i][j] == 0 and batch["advantages"][i][0] > 0


def test_nan_reward_spreads_to_the_whole_group():
    batch = build("nan-reward")
    assert all(torch.isnan(a).all() for a in batch["advantages"])
    healthy = build("healthy")
    assert all(torch.isfinite(a).all() for a in healthy["advantages"])


def test_nan_rollout_logprob_is_on_a_masked_token():
    batch = build("nan-rollout-logprob")
    i, j = batch["hazard_site"]
    assert torch.isnan(batch["rollout_log_probs"][i][j]) and batch["loss_masks"][i][j] == 0


@pytest.mark.parametrize("name", ["kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward"])
def test_defused_twin_differs_only_at_the_site(name):
    policy = hazards.synthetic_policy(512, 0)
    hot = hazards.build(name, policy, hazards.case_rollout(512, 0), 0)
    cold = hazards.build(name, policy, hazards.case_rollout(512, 0), 0, defused=True)
    assert all(torch.equal(a, b) for a, b in zip(hot["unconcat_tokens"], cold["unconcat_tokens"]))
    i, j = hot["hazard_site"]
    differing = {
        k for k in ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages")
        if not all(torch.equal(a, b) for a, b in zip(hot[k], cold[k]))
    }
    assert differing == {"kl-exp-overflow": {"ref_log_probs"}, "ratio-exp-overflow": {"log_probs"},
                         "nan-rollout-logprob": {"rollout_log_probs"}, "nan-reward": {"advantages"}}[name]
    # the defused twin is healthy for as-is
    logits = hazards.packed_logits(policy, cold["unconcat_tokens"]).requires_grad_(True)
    loss, _, _ = as_is.loss_function(case_args(global_batch_size=8), cold, 1, logits, parallel=Parallel())
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
