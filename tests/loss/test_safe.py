"""nanscope.loss.safe: equal to as-is on healthy batches, finite on every hazard, guards counted."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanscope import case, equivalence, hazards
from nanscope.causes import catalogue
from nanscope.facts import numerics
from nanscope.loss import as_is, safe
from nanscope.loss import guard as plugin_loss
from nanscope.loss.microbatch import Parallel


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_equal_to_as_is_on_healthy_batches(seed):
    # cp 1 and 2, temperatures, KL types and coefficients, entropy coef, TIS on/off, clip values,
    # per-token loss, loss-mask densities: all drawn by equivalence.random_case.
    d = equivalence.compare(equivalence.random_case(seed))
    assert d.loss <= 1e-6 and d.grad <= 1e-6


def test_equal_bitwise_on_the_case_config():
    for cp_size in (1, 2):
        d = equivalence.compare(equivalence.Case(seed=3, cp_size=cp_size))
        assert (d.loss, d.grad) == (0.0, 0.0)


@pytest.mark.parametrize("name", [h.name for h in catalogue.CATALOGUE if h.level == "batch" and h.safe_finite])
def test_every_hazard_is_finite(name):
    o = hazards.run_loss(name, "safe", flags=case.loss_flags())
    assert o.loss_finite and o.grad_finite and o.nan_grad_entries == 0
    assert all(math.isfinite(v) for v in o.metrics.values())


def hazard_batch(name, seed=0):
    policy = hazards.synthetic_policy(512, seed)
    batch = hazards.build(name, policy, case.rollout(512, seed), seed)
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    return batch, logits


def grads(module, batch, logits, **kw):
    loss, _, log = module.loss_function(case.args(global_batch_size=8, **kw), batch, 1, logits, parallel=Parallel())
    (g,) = torch.autograd.grad(loss, logits)
    return loss, g, dict(zip(log["keys"], log["values"][1:].tolist()))


@pytest.mark.parametrize("name", ["kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob"])
def test_masked_token_hazard_gives_the_healthy_gradient(name):
    # The hazard sits on a masked token: safe's gradient on the hazard batch equals its gradient on
    # the same batch without the hazard (and as-is's there), exactly.
    batch, logits = hazard_batch(name)
    clean = hazards.build(name, hazards.synthetic_policy(512, 0), case.rollout(512, 0), 0, defused=True)
    _, g_safe, metrics = grads(safe, batch, logits)
    _, g_clean, _ = grads(as_is, clean, logits)
    assert torch.equal(g_safe, g_clean)
    expected = {
        "kl-exp-overflow": "nan_guard/exp_overflow",
        "ratio-exp-overflow": "nan_guard/exp_overflow",
        "nan-rollout-logprob": "nan_guard/rollout_log_probs",
    }[name]
    assert metrics[expected] == 1.0 and metrics["nan_guard/dropped_tokens"] == 0.0


def test_nan_reward_drops_the_group_and_counts_it():
    batch, logits = hazard_batch("nan-reward")
    loss, g, metrics = grads(safe, batch, logits)
    assert loss.item() == 0.0 and torch.equal(g, torch.zeros_like(g))  # every sample of the group dropped
    assert metrics["nan_guard/advantages"] == 8.0
    assert metrics["nan_guard/dropped_tokens"] == sum(float(m.sum()) for m in batch["loss_masks"])


def test_unmasked_nan_old_logprob_is_dropped_with_zero_gradient():
    batch, logits = hazard_batch("healthy")
    i, j = 2, 0  # response token 0 of sample 2 is a model token (loss_mask 1)
    assert batch["loss_masks"][i][j] == 1
    batch["log_probs"][i][j] = float("nan")
    _, g, metrics = grads(safe, batch, logits)
    assert torch.isfinite(g).all()
    row = sum(batch["total_lengths"][:i]) + batch["total_lengths"][i] - batch["response_lengths"][i] - 1 + j
    assert torch.equal(g[0, row], torch.zeros_like(g[0, row]))  # the offending token gets no gradient
    assert metrics["nan_guard/log_probs"] == 1.0 and metrics["nan_guard/dropped_tokens"] == 1.0


def test_strict_names_sample_and_token():
    batch, logits = hazard_batch("nan-rollout-logprob")
    i, j = batch["hazard_site"]
    with pytest.raises(safe.NonFiniteInputError) as e:
        safe.policy_loss(case.args(global_batch_size=8), batch, logits, parallel=Parallel(), nan_policy="strict")
    assert str(e.value) == f"rollout_log_probs is nan at sample {i}, response token {j} (nan_policy=strict)"


def test_strict_names_the_global_token_under_cp():
    # cp rank 1 of (total 10, response 6) holds response tokens 0-5; put a NaN at token 4.
    batch = {
        "unconcat_tokens": [torch.arange(10)],
        "total_lengths": [10],
        "response_lengths": [6],
        "loss_masks": [torch.ones(6)],
        "log_probs": [torch.zeros(6)],
        "advantages": [torch.ones(6)],
    }
    batch["log_probs"][0][4] = float("inf")
    with pytest.raises(safe.NonFiniteInputError, match="log_probs is inf at sample 0, response token 4"):
        safe.policy_loss(
            case.args(use_tis=False, use_kl_loss=False),
            batch,
            torch.zeros(1, 6, 8),
            parallel=Parallel(cp_rank=1, cp_size=2),
            nan_policy="strict",
        )


def test_unknown_nan_policy():
    batch, logits = hazard_batch("healthy")
    with pytest.raises(ValueError, match="nan_policy 'ignore': expected one of drop, strict"):
        safe.policy_loss(case.args(global_batch_size=8), batch, logits, parallel=Parallel(), nan_policy="ignore")


def test_zero_coefficient_terms_are_reported_and_contribute_exact_zeros():
    # as-is keeps kl_loss_coef * kl_loss and entropy_coef * entropy_loss in its graph at coefficient 0,
    # and so does safe (it is as-is in the guard): the terms are reported as as-is reports them, and on
    # the kl-exp-overflow hazard the clamp keeps their zero-coefficient gradient an exact zero.
    batch, logits = hazard_batch("healthy")
    _, g_asis, m_asis = grads(as_is, batch, logits)
    _, g_safe, m_safe = grads(safe, batch, logits)
    assert m_safe["kl_loss"] == m_asis["kl_loss"] and m_safe["entropy_loss"] == m_asis["entropy_loss"]
    assert torch.equal(g_safe, g_asis)


# ---- the two pitfalls other frameworks fell into --------------------------------------------


def test_pitfall_selecting_after_exp_still_gives_nan():
    # torch.where after exp fixes the forward only: the unselected branch gets a zero gradient and
    # exp's backward computes 0 * inf = NaN. The clamp must come before exp.
    x = torch.tensor([100.0, 0.0], requires_grad=True)
    keep = torch.tensor([False, True])
    torch.where(keep, x.exp(), torch.zeros(2)).sum().backward()
    assert math.isnan(x.grad[0].item())
    x.grad = None
    x.clamp(-numerics.LOG_RATIO_BOUND, numerics.LOG_RATIO_BOUND).exp().mul(keep).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_pitfall_clamp_passes_nan():
    assert math.isnan(torch.tensor([float("nan")]).clamp(-20, 20).item())


def test_the_equivalence_measure_can_fail(monkeypatch):
    # A bound that binds on healthy data must show up as a difference.
    monkeypatch.setattr(plugin_loss, "LOG_RATIO_BOUND", 0.01)
    d = equivalence.compare(equivalence.random_case(3))
    assert d.loss > 1e-3 and d.grad > 1e-3
