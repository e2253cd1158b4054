"""Each formula twice: against an fp64 / hand-derived reference on benign input, and on adversarial input."""

import math

import pytest
import torch

from nanscope.loss import formulas as F

NAN, INF = float("nan"), float("inf")


# ---- log_probs / entropy -------------------------------------------------------------------


def test_log_probs_matches_fp64_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(7, 50) * 5
    tokens = torch.randint(0, 50, (7,))
    ref = torch.log_softmax(logits.double(), -1)[torch.arange(7), tokens]
    assert torch.allclose(F.log_probs(logits, tokens).double(), ref, atol=1e-5)


def test_log_probs_gradient_is_onehot_minus_softmax_in_bf16():
    # logits [0, 0] -> softmax [.5, .5]; d logp(token 1) / d logits = [-.5, .5], exact in bf16.
    logits = torch.zeros(1, 2, requires_grad=True)
    F.log_probs(logits, torch.tensor([1])).sum().backward()
    assert logits.grad.tolist() == [[-0.5, 0.5]]
    # A value that bf16 cannot hold is rounded, as megatron's fused backward rounds it.
    logits = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)  # softmax [.25, .75]
    (F.log_probs(logits, torch.tensor([0])) * (1 + 2**-10)).sum().backward()
    expected = torch.tensor([[0.75, -0.75]]) * (1 + 2**-10)
    assert torch.equal(logits.grad, expected.bfloat16().float())
    assert not torch.equal(logits.grad, expected)


def test_log_probs_of_an_extreme_gap_is_finite_and_exact():
    # A 100-unit gap at temperature 0.8: logp = -125 - log(1 + e^-125) ~ -125, no overflow.
    logits = torch.tensor([[100.0, 0.0]]) / 0.8
    assert F.log_probs(logits, torch.tensor([1])).item() == pytest.approx(-125.0)


def test_log_probs_empty_and_nonfinite():
    assert F.log_probs(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long)).shape == (0,)
    out = F.log_probs(torch.tensor([[NAN, 0.0], [INF, 0.0]]), torch.tensor([1, 1]))
    assert torch.isnan(out).all()  # non-finite logits are not the loss's job to repair


def test_entropy_matches_fp64_and_its_gradient():
    torch.manual_seed(1)
    logits = (torch.randn(5, 30) * 3).requires_grad_(True)
    ref_logits = logits.detach().double().requires_grad_(True)
    p = torch.softmax(ref_logits, -1)
    ref = -(p * torch.log_softmax(ref_logits, -1)).sum(-1)
    ent = F.entropy(logits)
    assert torch.allclose(ent.double(), ref, atol=1e-5)
    ent.sum().backward()
    ref.sum().backward()
    assert torch.allclose(logits.grad.double(), ref_logits.grad, atol=1e-5)


def test_entropy_adversarial():
    assert F.entropy(torch.zeros(0, 4)).shape == (0,)
    # uniform over 4 -> log 4; one -inf logit is fine (a masked vocabulary entry): log 3
    assert F.entropy(torch.zeros(1, 4)).item() == pytest.approx(math.log(4))
    assert F.entropy(torch.tensor([[0.0, 0.0, 0.0, -INF]])).item() != F.entropy(torch.zeros(1, 4)).item()


# ---- approx_kl ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kl", "k2", "k3", "low_var_kl"])
def test_approx_kl_against_fp64(kind):
    r = torch.linspace(-2, 2, 41)
    rd = r.double()
    ref = {"kl": rd, "k2": rd**2 / 2, "k3": (-rd).exp() - 1 + rd, "low_var_kl": ((-rd).exp() - 1 + rd).clamp(-10, 10)}[
        kind
    ]
    assert torch.allclose(F.approx_kl(r, kind).double(), ref, atol=1e-6)


def test_low_var_kl_overflow_finite_forward_nan_backward():
    # ref - logp = 90 > 88.72: exp(90) = inf, clamp -> 10 (finite), backward 0 * inf = NaN.
    r = torch.tensor([-90.0, -0.1], requires_grad=True)
    kl = F.approx_kl(r, "low_var_kl")
    assert kl.tolist()[0] == 10.0
    (kl * torch.tensor([0.0, 1.0])).sum().backward()  # masked by multiplication, coefficient irrelevant
    assert math.isnan(r.grad[0].item()) and math.isfinite(r.grad[1].item())


def test_approx_kl_nan_and_unknown_type():
    assert math.isnan(F.approx_kl(torch.tensor([NAN]), "low_var_kl").item())  # clamp passes NaN
    with pytest.raises(ValueError, match="unknown kl_loss_type 'k4'"):
        F.approx_kl(torch.zeros(1), "k4")


# ---- ppo_clip_loss --------------------------------------------------------------------------


def test_ppo_clip_hand_derived():
    # ppo_kl = old - logp. Token 0: ratio e^0.1 = 1.10517 inside [0.8, 1.28], adv 1 -> -1.10517.
    # Token 1: ratio e^0.5 = 1.64872 > 1.28, adv 1 -> max(-1.64872, -1.28) = -1.28, clipped.
    # Token 2: ratio e^0.5, adv -1 -> max(1.64872, 1.28) = 1.64872, not clipped.
    ppo_kl = torch.tensor([-0.1, -0.5, -0.5])
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, clipfrac = F.ppo_clip_loss(ppo_kl, adv, 0.2, 0.28)
    assert loss.tolist() == pytest.approx([-math.exp(0.1), -1.28, math.exp(0.5)], rel=1e-6)
    assert clipfrac.tolist() == [0.0, 1.0, 0.0]


def test_ppo_dual_clip_hand_derived():
    # adv -1, ratio e^2 = 7.389: plain PPO gives 7.389; dual clip caps it at eps_clip_c * |adv| = 3.
    loss, _ = F.ppo_clip_loss(torch.tensor([-2.0]), torch.tensor([-1.0]), 0.2, 0.28, eps_clip_c=3.0)
    assert loss.tolist() == [3.0]


def test_ppo_ratio_overflow():
    # logp - old = 90 > 88.72: ratio = inf. adv > 0: clipped branch wins -> finite loss, NaN grad.
    logp = torch.tensor([0.0], requires_grad=True)
    old = torch.tensor([-90.0])
    loss, _ = F.ppo_clip_loss(old - logp, torch.tensor([1.0]), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28)
    loss.sum().backward()
    assert math.isnan(logp.grad.item())
    # adv < 0: the unclipped branch wins with +inf; times a zero mask it is NaN.
    loss, _ = F.ppo_clip_loss(torch.tensor([-90.0]), torch.tensor([-1.0]), 0.2, 0.28)
    assert loss.item() == INF and math.isnan((loss * 0).item())


def test_ppo_empty():
    loss, clipfrac = F.ppo_clip_loss(torch.zeros(0), torch.zeros(0), 0.2, 0.28)
    assert loss.shape == clipfrac.shape == (0,)


# ---- tis_weights ----------------------------------------------------------------------------


def test_tis_hand_derived_and_adversarial():
    tis, clipped = F.tis_weights(torch.tensor([0.0, math.log(3.0), -1.0]), 0.0, 2.0)
    assert tis.tolist() == pytest.approx([1.0, 3.0, math.exp(-1)], rel=1e-6)
    assert clipped.tolist() == pytest.approx([1.0, 2.0, math.exp(-1)], rel=1e-6)
    tis, clipped = F.tis_weights(torch.tensor([NAN, INF, -INF, 100.0]), 0.0, 2.0)
    assert math.isnan(clipped[0].item())  # clamp passes NaN: the nan-rollout-logprob mechanism
    assert clipped[1:].tolist() == [2.0, 0.0, 2.0]


# ---- sum_of_sample_mean ---------------------------------------------------------------------


def test_sum_of_sample_mean_hand_derived():
    # sample 0: (1*1 + 2*0 + 3*1) / 2 = 2; sample 1: (4*1) / 1 = 4; total 6.
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0])]
    dens = [torch.tensor(2.0), torch.tensor(1.0)]
    assert F.sum_of_sample_mean(x, masks, dens).item() == 6.0
    assert F.sum_of_sample_mean(x, masks, dens, select=True).item() == 6.0


def test_sum_of_sample_mean_masked_nonfinite_multiply_vs_select():
    x = torch.tensor([1.0, NAN, INF, 4.0], requires_grad=True)
    masks = [torch.tensor([1.0, 0.0, 0.0]), torch.tensor([1.0])]
    dens = [torch.tensor(1.0), torch.tensor(1.0)]
    assert math.isnan(F.sum_of_sample_mean(x, masks, dens).item())  # NaN * 0 and inf * 0
    safe = F.sum_of_sample_mean(x, masks, dens, select=True)
    assert safe.item() == 5.0
    safe.backward()
    assert x.grad.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_sum_of_sample_mean_all_masked_and_empty():
    masks = [torch.zeros(3)]
    assert F.sum_of_sample_mean(torch.ones(3), masks, [torch.tensor(1.0)]).item() == 0.0
    assert F.sum_of_sample_mean(torch.zeros(0), [], []).item() == 0.0


# ---- grpo_normalize -------------------------------------------------------------------------


def test_grpo_normalize_hand_derived():
    # group [0, 1, 1, 0]: mean .5, centred [-.5, .5, .5, -.5], unbiased std sqrt(1/3) = .57735
    out = F.grpo_normalize(torch.tensor([0.0, 1.0, 1.0, 0.0]), 4)
    s = math.sqrt(1 / 3) + 1e-6
    assert out.tolist() == pytest.approx([-0.5 / s, 0.5 / s, 0.5 / s, -0.5 / s], rel=1e-6)
    assert F.grpo_normalize(torch.tensor([0.0, 1.0]), 2, std_normalization=False).tolist() == [-0.5, 0.5]


def test_grpo_normalize_nonfinite_spreads_to_the_group_only():
    out = F.grpo_normalize(torch.tensor([NAN, 1.0, 0.0, 1.0, 0.0, 1.0]), 3)
    assert torch.isnan(out[:3]).all() and torch.isfinite(out[3:]).all()
    out = F.grpo_normalize(torch.tensor([INF, 1.0]), 2)
    assert torch.isnan(out).all()  # inf - inf
    # identical rewards: std 0, centred 0 -> 0 / 1e-6 = 0, finite
    assert F.grpo_normalize(torch.ones(4), 4).tolist() == [0.0] * 4
    # a group of one: unbiased std of one element is NaN
    assert math.isnan(F.grpo_normalize(torch.tensor([1.0]), 1).item())
