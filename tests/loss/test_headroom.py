"""Headroom formulas: against fp64 references on benign input, and on adversarial input (NaN, ±inf, empty,
all masked, log-ratios past fp32's exp limit)."""

import math

import torch

from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.loss import headroom as H

NAN, INF = float("nan"), float("inf")


def sizes(*n):
    return torch.tensor(n, dtype=torch.int64)


def test_maximum_is_the_fp64_maximum_and_names_its_sample():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, generator=g, dtype=torch.float64)
    m = H.maximum(x.float(), sizes(10, 25, 15))
    k = int(x.argmax())
    # sample of token k: 0 for [0, 10), 1 for [10, 35), 2 for [35, 50)
    assert m.value.item() == x.float()[k].item() and m.sample.item() == (0 if k < 10 else 1 if k < 35 else 2)


def test_maximum_over_kept_entries_only():
    x = torch.tensor([5.0, 1.0, 9.0, 2.0])
    keep = torch.tensor([True, True, False, True])
    m = H.maximum(x, sizes(2, 2), keep)
    assert (m.value.item(), m.sample.item()) == (5.0, 0)


def test_maximum_of_nothing_is_minus_inf_at_no_sample():
    empty = H.maximum(torch.zeros(0), sizes())
    masked = H.maximum(torch.tensor([1.0, 2.0]), sizes(2), torch.tensor([False, False]))
    assert [(m.value.item(), m.sample.item()) for m in (empty, masked)] == [(-INF, -1), (-INF, -1)]


def test_a_nan_is_the_maximum_and_points_at_its_sample():
    m = H.maximum(torch.tensor([1.0, 7.0, NAN, 3.0]), sizes(1, 1, 2))
    assert math.isnan(m.value.item()) and m.sample.item() == 2


def test_inf_is_a_maximum():
    m = H.maximum(torch.tensor([1.0, INF, -INF]), sizes(2, 1))
    assert (m.value.item(), m.sample.item()) == (INF, 0)


def test_log_ratios_are_the_exponents_slime_computes():
    logp = torch.tensor([-1.0, -138.0, -0.5])
    old = torch.tensor([-1.5, -138.0, -0.25])
    ref = torch.tensor([-1.0, -1.0, -0.5])
    rollout = torch.tensor([-1.25, 0.0, -0.5]).bfloat16()
    assert H.ppo_log_ratio(logp, old).tolist() == [0.5, 0.0, -0.25]
    kl = H.kl_log_ratio(logp, ref)
    assert kl.tolist() == [0.0, 137.0, 0.0] and kl[1] > FP32_EXP_MAX  # exp(ref - logp) overflows in fp32
    assert torch.isinf(kl.exp()[1])
    assert H.tis_log_ratio(old, rollout).tolist() == [-0.25, -138.0, 0.25]
    assert H.train_rollout_gap(logp, rollout).tolist() == [0.25, 138.0, 0.0]


def test_clamped_counts_tokens_beyond_the_bound_on_either_side_not_nan():
    a = torch.tensor([0.0, 25.0, -21.0, NAN, 19.9])
    b = torch.tensor([30.0, 0.0, 0.0, 0.0, 0.0])
    assert H.clamped([a, b]).item() == 3  # token 0 (b), 1 (a), 2 (a); NaN is not clamped, 19.9 is inside
    assert H.clamped([torch.zeros(0)]).item() == 0


def test_quantile_matches_fp64_and_handles_empty_and_nan():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1000, generator=g, dtype=torch.float64)
    assert abs(H.quantile(x.float(), 0.99).item() - torch.quantile(x, 0.99).item()) < 1e-6
    assert H.quantile(torch.zeros(0), 0.99).item() == -INF
    assert math.isnan(H.quantile(torch.tensor([1.0, NAN]), 0.99).item())
