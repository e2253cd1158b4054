"""The catalogue: each hazard gives its stated finiteness through slime v0.1.0's loss."""

import re

import pytest
import torch

from nanscope import case, hazards
from nanscope.causes import catalogue, immune
from nanscope.causes.classes import CLASSES
from nanscope.errors import UserError
from nanscope.facts.args import LOSS_FIELDS
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.loss import as_is
from nanscope.loss.microbatch import Parallel

BATCH = [h.name for h in catalogue.CATALOGUE if h.level == "batch"]


@pytest.mark.parametrize("name", BATCH)
def test_as_is_gives_the_stated_finiteness(name):
    h = catalogue.get(name)
    o = hazards.run_loss(name, "as-is", flags=case.loss_flags())
    assert (o.loss_finite, o.grad_finite) == (h.loss_finite, h.grad_finite)
    assert (o.nan_grad_entries == 0) == h.grad_finite


@pytest.mark.parametrize("name", BATCH)
def test_safe_gives_the_stated_finiteness(name):
    o = hazards.run_loss(name, "safe", flags=case.loss_flags())
    assert (o.loss_finite and o.grad_finite) == catalogue.get(name).safe_finite


def test_unknown_name_lists_every_known_hazard():
    with pytest.raises(ValueError, match="unknown hazard 'nope'; known: healthy, kl-exp-overflow, .*, zero-temp"):
        catalogue.get("nope")


def test_records_are_complete():
    assert len({h.name for h in catalogue.CATALOGUE} | {c.name for c in immune.IMMUNE}) == len(
        catalogue.CATALOGUE
    ) + len(immune.IMMUNE)
    for h in catalogue.CATALOGUE[1:]:
        assert h.cause_class in CLASSES and h.fix and h.discriminator, h.name
        assert h.level in ("batch", "model") and (h.fault is not None) == (h.level == "model"), h.name
        assert set(h.loss_overrides) <= set(LOSS_FIELDS)
    assert catalogue.HEALTHY.cause_class is None
    for h in catalogue.CATALOGUE:
        if h.fault:
            assert re.fullmatch(r"decoder\.[\w.]+:(forward|backward|zero-tokens):(nan|inf)", h.fault), h.fault
    for c in immune.IMMUNE:
        assert c.cause_class in CLASSES
        for ev in c.evidence:
            assert re.fullmatch(r"(slime|megatron)/[\w/]+\.py:\d+ \((slime v0\.1\.0|megatron-core 0\.15\.0rc0)\)", ev)


def build(name, seed=0):
    policy = hazards.synthetic_policy(512, seed)
    return hazards.build(name, policy, case.rollout(512, seed), seed)


def test_batches_are_mutually_consistent():
    policy = hazards.synthetic_policy(512, 0)
    batch = build("healthy")
    # old log-probs are the policy's own log-probs of the tokens (one step per rollout)
    rollout = hazards.Rollout(
        batch["unconcat_tokens"],
        batch["response_lengths"],
        batch["loss_masks"],
        batch["rewards"],
        **hazards.shape(case.loss_flags()),
    )
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
    hot = hazards.build(name, policy, case.rollout(512, 0), 0)
    cold = hazards.build(name, policy, case.rollout(512, 0), 0, defused=True)
    assert all(torch.equal(a, b) for a, b in zip(hot["unconcat_tokens"], cold["unconcat_tokens"]))
    i, j = hot["hazard_site"]
    differing = {
        k
        for k in ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages")
        if not all(torch.equal(a, b) for a, b in zip(hot[k], cold[k]))
    }
    assert (
        differing
        == {
            "kl-exp-overflow": {"ref_log_probs"},
            "ratio-exp-overflow": {"log_probs"},
            "nan-rollout-logprob": {"rollout_log_probs"},
            "nan-reward": {"advantages"},
        }[name]
    )
    # the defused twin is healthy for as-is
    logits = hazards.packed_logits(policy, cold["unconcat_tokens"]).requires_grad_(True)
    loss, _, _ = as_is.loss_function(case.args(global_batch_size=8), cold, 1, logits, parallel=Parallel())
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_zero_temperature_poisons_the_log_prob_pass_not_sglang():
    batch = build("zero-temperature")
    assert batch["hazard_site"] is None
    assert all(torch.isnan(x).all() for key in ("log_probs", "ref_log_probs") for x in batch[key])
    assert all(torch.isfinite(x).all() for x in batch["rollout_log_probs"])
    healthy = build("healthy")
    assert all(torch.equal(a, b) for a, b in zip(batch["rollout_log_probs"], healthy["rollout_log_probs"]))
    # the hazard is the flag: the loss sees it through the override, the defused twin is the healthy batch
    assert catalogue.ZERO_TEMPERATURE.loss_overrides == {"rollout_temperature": 0.0}
    cold = hazards.build("zero-temperature", hazards.synthetic_policy(512, 0), case.rollout(512, 0), 0, defused=True)
    assert all(torch.equal(a, b) for a, b in zip(cold["log_probs"], healthy["log_probs"]))


def test_rollout_logprob_shift_is_misaligned_by_one_token_and_stays_finite():
    batch, healthy = build("rollout-logprob-shift"), build("healthy")
    for shifted, aligned in zip(batch["rollout_log_probs"], healthy["rollout_log_probs"]):
        assert torch.equal(shifted[:-1], aligned[1:]) and shifted[-1] == 0
    o = hazards.run_loss("rollout-logprob-shift", "as-is", flags=case.loss_flags())
    assert o.loss_finite and o.grad_finite
    # the tis metric (a sum of per-sample means) explodes far past tis_clip: the mismatch shows there only
    healthy = hazards.run_loss("healthy", "as-is", flags=case.loss_flags()).metrics
    assert healthy["tis"] < case.args().tis_clip * case.group_size() < 1e20 < o.metrics["tis"]
    assert healthy["tis_clipfrac"] == 0 and o.metrics["tis_clipfrac"] > 0.25 * case.group_size()


@pytest.mark.parametrize("h", [h for h in catalogue.CATALOGUE if h.level == "model"], ids=lambda h: h.name)
def test_model_faults_have_no_batch(h):
    batch, healthy = build(h.name), build("healthy")
    assert all(torch.equal(a, b) for a, b in zip(batch["log_probs"], healthy["log_probs"]))
    with pytest.raises(
        UserError,
        match=f"hazard '{h.name}' is a fault in the model, not a batch: run `nanscope repro --hazard {h.name}`",
    ):
        hazards.run_loss(h.name, flags=case.loss_flags())
