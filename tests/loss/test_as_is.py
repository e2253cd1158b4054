"""nanscope.loss.as_is: hand-derived values, CP equivalence, healthy-batch finiteness."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanscope import case, hazards
from nanscope.facts.args import loss_args
from nanscope.loss import as_is, microbatch
from nanscope.loss.microbatch import Parallel

LN2 = math.log(2.0)


def two_sample_batch(old_shift=0.0):
    """Vocab 2, all logits 0 -> every token has logp -ln2, entropy ln2.

    Sample A: total 3, response 2 (tokens at positions 1, 2), mask [1, 0], advantage +1.
    Sample B: total 2, response 1 (token at position 1), mask [1], advantage -0.5.
    All response tokens are token 1; old = ref = rollout = -ln2 - old_shift.
    """
    lp = lambda n: torch.full((n,), -LN2 - old_shift)
    batch = {
        "unconcat_tokens": [torch.tensor([0, 1, 1]), torch.tensor([0, 1])],
        "total_lengths": [3, 2],
        "response_lengths": [2, 1],
        "loss_masks": [torch.tensor([1.0, 0.0]), torch.tensor([1.0])],
        "log_probs": [lp(2), lp(1)],
        "ref_log_probs": [torch.full((2,), -LN2), torch.full((1,), -LN2)],
        "rollout_log_probs": [lp(2), lp(1)],
        "advantages": [torch.full((2,), 1.0), torch.full((1,), -0.5)],
    }
    logits = torch.zeros(1, 5, 2, requires_grad=True)
    return batch, logits


def test_hand_derived_two_samples():
    # ratio 1 everywhere, so pg = -adv: A -> (-1*1 + -1*0)/1 = -1, B -> (0.5*1)/1 = 0.5; pg_loss -0.5.
    # loss_function scales by num_microbatches / global_batch_size * dp_cp = 1/2 -> -0.25.
    batch, logits = two_sample_batch()
    args = case.args(global_batch_size=2, rollout_temperature=1.0)
    loss, normalizer, log = as_is.loss_function(args, batch, 1, logits, parallel=Parallel())
    assert loss.item() == pytest.approx(-0.25)
    assert normalizer == 1
    metrics = dict(zip(log["keys"], log["values"][1:].tolist()))
    assert log["values"][0].item() == 2  # number of samples
    assert metrics["pg_loss"] == pytest.approx(-0.5)
    assert metrics["entropy_loss"] == pytest.approx(2 * LN2)  # per-sample mean ln2, two samples
    assert metrics["kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["tis"] == pytest.approx(2.0) and metrics["pg_clipfrac"] == 0.0
    loss.backward()
    # d loss/d logp: A token 0 -> -adv * ratio / den * 1/2 = -0.5; A token 1 masked -> 0; B -> +0.25.
    # d logp/d logits (token 1 of vocab 2, uniform) = [-0.5, 0.5].
    # Packed rows: A occupies rows 0-2 (rows 0, 1 predict its response), B rows 3-4 (row 3 predicts).
    expected = torch.tensor([[0.25, -0.25], [0.0, 0.0], [0.0, 0.0], [-0.125, 0.125], [0.0, 0.0]])
    assert torch.equal(logits.grad[0], expected)


def test_hand_derived_clip():
    # old = -ln2 - 0.5 -> ratio e^0.5 = 1.6487 > 1.28. A (adv 1): clipped to -1.28, clipfrac 1.
    # B (adv -0.5): max(0.5 * 1.6487, 0.5 * 1.28) = 0.8244, not clipped. pg_loss = -1.28 + 0.8244.
    # TIS weight exp(old - rollout) = 1.
    batch, logits = two_sample_batch(old_shift=0.5)
    args = case.args(global_batch_size=2, rollout_temperature=1.0)
    loss, log = as_is.policy_loss(
        args, batch, logits, microbatch.make_sum_of_sample_mean(batch, Parallel(), False, False)
    )
    assert loss.item() == pytest.approx(-1.28 + 0.5 * math.exp(0.5), rel=1e-6)
    assert log["pg_clipfrac"].item() == 1.0  # A's token (clipped) counts 1, B's 0


def test_temperature_divides_logits():
    # logits [0, 2 ln 3] at T = 2 -> [0, ln 3] -> p(token 1) = 3/4.
    batch = {
        "unconcat_tokens": [torch.tensor([0, 1])],
        "total_lengths": [2],
        "response_lengths": [1],
        "loss_masks": [torch.ones(1)],
        "log_probs": [torch.zeros(1)],
        "advantages": [torch.zeros(1)],
    }
    logits = torch.tensor([[[0.0, 2 * math.log(3)], [0.0, 0.0]]])
    logp, _ = microbatch.log_probs_and_entropy(logits, batch, 2.0, Parallel())
    assert logp.item() == pytest.approx(math.log(0.75))


def test_empty_local_slice_keeps_the_graph_connected():
    # cp rank 0 of total 10 / response 6 holds no response token (see test_layout).
    batch, _ = two_sample_batch()
    batch = {
        "unconcat_tokens": [torch.arange(10)],
        "total_lengths": [10],
        "response_lengths": [6],
        "loss_masks": [torch.ones(6)],
        "log_probs": [torch.zeros(0)],
        "ref_log_probs": [torch.zeros(0)],
        "rollout_log_probs": [torch.zeros(0)],
        "advantages": [torch.zeros(0)],
    }
    logits = torch.zeros(1, 6, 16, requires_grad=True)
    loss, _, _ = as_is.loss_function(
        case.args(global_batch_size=1), batch, 1, logits, parallel=Parallel(cp_rank=0, cp_size=2, dp_cp_size=2)
    )
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_cp2_pieces_sum_to_cp1(seed, per_token):
    policy = hazards.synthetic_policy(64, seed, logit_std=3.0)
    batch = hazards.build("healthy", policy, case.rollout(64, seed), seed)
    full = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    args = case.args(global_batch_size=8, calculate_per_token_loss=per_token, entropy_coef=0.01, kl_loss_coef=0.1)

    loss1, _, log1 = as_is.loss_function(args, batch, 1, full, parallel=Parallel())
    (grad1,) = torch.autograd.grad(loss1, full)

    total, grad2, values = 0.0, torch.zeros_like(full), 0
    for r in range(2):
        par = Parallel(cp_rank=r, cp_size=2, dp_cp_size=2)
        loss_r, _, log_r = as_is.loss_function(
            args,
            microbatch.slice_for_cp(batch, par),
            1,
            microbatch.cp_local_logits(full, batch["total_lengths"], par),
            parallel=par,
        )
        (g,) = torch.autograd.grad(loss_r, full)
        # loss_function multiplies by dp_cp (2 here); Megatron's DDP averages over the DP x CP group.
        total, grad2, values = total + loss_r.item() / 2, grad2 + g / 2, values + log_r["values"]
    assert total == pytest.approx(loss1.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(grad2, grad1, rtol=1e-4, atol=1e-8)
    # metrics: the sums over CP ranks of the sample-mean pieces equal the cp1 metrics.
    # (fp32 sums of ~200 O(1) terms: absolute error ~1e-6 where they cancel)
    assert torch.allclose(values[1:], log1["values"][1:], rtol=1e-4, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    temperature=st.sampled_from([0.6, 0.8, 1.0]),
    kl_type=st.sampled_from(["kl", "k2", "k3", "low_var_kl"]),
    use_tis=st.booleans(),
    mask_p=st.floats(0.0, 1.0),
)
def test_healthy_batches_are_finite(seed, temperature, kl_type, use_tis, mask_p):
    policy = hazards.synthetic_policy(128, seed, logit_std=4.0)
    rollout = case.rollout(128, seed, n_samples=4)
    g = torch.Generator().manual_seed(seed)
    rollout.loss_masks = [(torch.rand(m.shape, generator=g) < mask_p).float() for m in rollout.loss_masks]
    batch = hazards.build("healthy", policy, rollout, seed, temperature=temperature)
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    args = case.args(global_batch_size=4, rollout_temperature=temperature, kl_loss_type=kl_type, use_tis=use_tis)
    loss, _, log = as_is.loss_function(args, batch, 1, logits, parallel=Parallel())
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all() and torch.isfinite(log["values"]).all()


def test_custom_loss_is_dispatched_like_slime(monkeypatch):
    import sys
    import types

    calls = {}

    def my_loss(args, batch, logits, sum_of_sample_mean):
        calls["kwargs"] = True
        return logits.sum() * 0 + 3.0, {"x": torch.tensor(1.0)}

    mod = types.ModuleType("my_mod")
    mod.my_loss = my_loss
    monkeypatch.setitem(sys.modules, "my_mod", mod)
    batch, logits = two_sample_batch()
    args = loss_args(loss_type="custom_loss", custom_loss_function_path="my_mod.my_loss", global_batch_size=4)
    loss, _, log = as_is.loss_function(args, batch, 2, logits, parallel=Parallel())
    assert calls and loss.item() == 1.5 and log["keys"] == ["x"]  # 3 * 2 / 4


def test_unknown_loss_type():
    batch, logits = two_sample_batch()
    with pytest.raises(ValueError, match="loss_type 'sft_loss' is not modelled"):
        as_is.loss_function(loss_args(loss_type="sft_loss"), batch, 1, logits, parallel=Parallel())
