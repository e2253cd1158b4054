"""nanscope.loss.padded: the guard's formulas on verl's padded [B, T] inputs, against fp64 and adversarial input."""

import math

import torch

from nanscope.facts.numerics import FP32_EXP_MAX, LOG_RATIO_BOUND
from nanscope.loss import padded


def _batch(seed=0, b=3, t=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(b, t, generator=g)
    return logp, old


def test_cleaned_zeroes_nonfinite_entries_and_keeps_the_finite_bits():
    x = torch.tensor([[1.5, float("nan"), -float("inf")], [float("inf"), -0.25, 3e38]])
    out, finite = padded.cleaned(x)
    assert torch.equal(finite, torch.tensor([[True, False, False], [False, True, True]]))
    assert torch.equal(out, torch.tensor([[1.5, 0.0, 0.0], [0.0, -0.25, 3e38]]))
    assert out.dtype == x.dtype


def test_masked_out_keeps_the_mask_dtype():
    for dtype in (torch.bool, torch.int64, torch.float32):
        mask = torch.ones(2, 2, dtype=dtype)
        out = padded.masked_out(mask, torch.tensor([[True, False], [False, False]]))
        assert out.dtype == dtype and out.tolist() == [[0, 1], [1, 1]]


def test_selected_gives_zero_at_masked_entries_even_for_huge_ones():
    x = torch.tensor([[3e38, 2.0], [-3e38, 1.0]])
    mask = torch.tensor([[False, True], [False, True]])
    out = padded.selected(x, mask)
    assert torch.equal(out, torch.tensor([[0.0, 2.0], [0.0, 1.0]]))
    assert torch.isfinite(out * torch.exp(torch.tensor(20.0))).all()


def test_bounded_old_is_the_same_bits_within_the_bound():
    logp, old = _batch()
    out = padded.bounded_old(old, logp)
    assert torch.equal(out, old)


def test_bounded_old_clamps_the_difference_against_fp64_and_has_zero_gradient_there():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    old = torch.tensor([[-96.0, 60.0, -0.6, -3.0 - 1e-3]])  # log-ratios 95, -62, 0.1, 0.001
    out = padded.bounded_old(old, logp)
    diff = logp - out
    want = (logp.detach().double() - old.double()).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    assert torch.allclose(diff.double(), want, atol=1e-5, rtol=0)
    assert torch.equal(out[0, 2:], old[0, 2:])  # within the bound: the same bits
    torch.exp(diff).sum().backward()
    grad = logp.grad
    assert grad[0, 0] == 0 and grad[0, 1] == 0  # moved: zero gradient, as torch.clamp's outside its range
    assert torch.allclose(grad[0, 2:].double(), torch.exp(want[0, 2:]), rtol=1e-6)
    assert torch.isfinite(torch.exp(diff)).all()


def test_bounded_old_keeps_a_nan_log_prob_visible():
    logp = torch.tensor([[float("nan"), -1.0]])
    old = torch.tensor([[-1.0, -1.0]])
    out = padded.bounded_old(old, logp)
    assert torch.equal(out, old)
    assert torch.isnan(logp - out)[0, 0]


def test_headroom_maximum_its_row_and_the_counts():
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, -1.0]])
    old = torch.tensor([[-1.5, -30.0, -1.0], [-100.0, -1.0, -1.0]])  # ratios 0.5, 29, 0 / 99, -1, 0
    h = padded.headroom(old, logp)
    assert float(h.max_log_ratio) == 99.0 and int(h.sample) == 1
    assert float(h.overflow) == 1.0  # 99 > 88.72
    assert float(h.clamped) == 2.0  # 29 and 99 beyond 20
    assert FP32_EXP_MAX < 99.0


def test_headroom_a_nan_is_the_maximum_and_no_token_is_minus_inf():
    logp = torch.tensor([[-1.0, float("nan")], [-1.0, -1.0]])
    old = torch.zeros(2, 2)
    h = padded.headroom(old, logp)
    assert math.isnan(float(h.max_log_ratio)) and int(h.sample) == 0
    empty = padded.headroom(torch.zeros(0, 4), torch.zeros(0, 4))
    assert float(empty.max_log_ratio) == float("-inf") and int(empty.sample) == -1 and float(empty.overflow) == 0


def test_empty_inputs_pass_through():
    logp, old = torch.zeros(0, 3, requires_grad=True), torch.zeros(0, 3)
    assert padded.bounded_old(old, logp).shape == (0, 3)
    assert padded.cleaned(old)[0].shape == (0, 3)


def test_the_guard_reads_no_value_to_the_host():
    # on the meta device any host read (.item(), bool(), a boolean index, nonzero) raises: the guard makes none
    logp = torch.empty(3, 5, device="meta", requires_grad=True)
    old = torch.empty(3, 5, device="meta")
    mask = torch.empty(3, 5, dtype=torch.bool, device="meta")
    clean, finite = padded.cleaned(old)
    moved = padded.bounded_old(clean, logp)
    adv = padded.selected(padded.cleaned(torch.empty(3, 5, device="meta"))[0], padded.masked_out(mask, ~finite))
    h = padded.headroom(clean, logp)
    assert moved.shape == adv.shape == (3, 5) and h.max_log_ratio.device.type == "meta"
