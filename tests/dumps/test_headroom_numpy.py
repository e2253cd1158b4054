"""scan's numpy headroom formulas (`nanscope.dumps.headroom`) against their one definition, the plugin's torch
ones (`nanscope.loss.headroom`): the same fp32 values, bit for bit, on benign and adversarial input."""

import math

import numpy as np
import pytest
import torch

from nanscope.dumps import headroom as N
from nanscope.dumps.sample_checks import bf16
from nanscope.loss import headroom as T

NAN, INF = float("nan"), float("inf")


def inputs():
    """Pairs of fp32 log-prob arrays: random, with a NaN, with ±inf, past the exp limit, one entry, empty."""
    rng = np.random.default_rng(7)
    a, b = (-rng.exponential(2.0, 300)).astype(np.float32), (-rng.exponential(2.0, 300)).astype(np.float32)
    with_nan, with_inf = a.copy(), a.copy()
    with_nan[[17, 200]] = NAN
    with_inf[[3, 4]] = [INF, -INF]
    far = b.copy()
    far[50] = -120.0
    return [
        (a, b),
        (with_nan, b),
        (with_inf, b),
        (a, far),
        (a[:1], b[:1]),
        (a[:0], b[:0]),
    ]


def same(x: np.ndarray, y: torch.Tensor) -> bool:
    """Bitwise-equal fp32 arrays (NaN where NaN)."""
    return x.dtype == np.float32 and np.array_equal(x, y.numpy(), equal_nan=True)


@pytest.mark.parametrize("case", range(6))
def test_log_ratios_and_gap_are_torch_s(case):
    p, q = inputs()[case]
    tp, tq = torch.from_numpy(p), torch.from_numpy(q)
    with np.errstate(invalid="ignore", over="ignore"):
        assert same(N.kl_log_ratio(p, q), T.kl_log_ratio(tp, tq))
        assert same(N.tis_log_ratio(p, q), T.tis_log_ratio(tp, tq))
        assert same(N.train_rollout_gap(p, q), T.train_rollout_gap(tp, tq))


def test_tis_with_bf16_rollout_log_probs_is_torch_s():
    # v0.1.0 trains with bf16 rollout log-probs: scan rounds them with `bf16`, torch holds a bfloat16 tensor
    old, rollout = inputs()[0]
    got = N.tis_log_ratio(old, bf16(rollout))
    want = T.tis_log_ratio(torch.from_numpy(old), torch.from_numpy(rollout).to(torch.bfloat16))
    assert same(got, want)


@pytest.mark.parametrize("case", range(6))
def test_maximum_is_torch_s_value_and_position(case):
    x = inputs()[case][0]
    value, at = N.maximum(x)
    # one token per sample: torch's sample index is the token's position
    m = T.maximum(torch.from_numpy(x), torch.ones(x.size, dtype=torch.int64))
    assert (value, at) == pytest.approx((m.value.item(), m.sample.item()), nan_ok=True)
    assert math.isnan(value) == math.isnan(m.value.item())


def quantile_tolerance(x: np.ndarray, q: float, want: float) -> float:
    """How far two evaluations of the q-quantile of `x` by linear interpolation may be apart: one fp32 ulp of the
    value (torch's CPU lerp fuses its multiply-add where it vectorises, so the last bit depends on the machine),
    plus what rounding the rank q * (N - 1) to fp32 or not moves it: one ulp of the rank times the steepest slope of
    the interpolation around it (the gaps between the sorted entries next to it). torch 2.13.0, the harness's,
    rounds it as scan does (the two are then bitwise equal on this project's x86 machines); torch 2.14.1 does not
    (up to 1e-5 relative apart, measured on its CUDA build)."""
    ordered = np.sort(x).astype(np.float64)
    rank = np.float32(q) * np.float32(x.size - 1)
    near = ordered[max(int(rank) - 1, 0) : int(np.ceil(rank)) + 2]
    slope = float(np.abs(np.diff(near)).max()) if near.size > 1 else 0.0
    return float(np.spacing(np.float32(want))) + slope * float(np.spacing(rank))


@pytest.mark.parametrize("case", range(6))
@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0])
def test_quantile_is_torch_s(case, q):
    x = np.abs(inputs()[case][0])
    got, want = N.quantile(x, q), T.quantile(torch.from_numpy(x), q).item()
    if got == want or (math.isnan(got) and math.isnan(want)):
        return
    assert abs(got - want) <= quantile_tolerance(x, q, want), (got, want)


def test_quantile_is_torch_s_within_the_rank_s_rounding_on_many_sizes():
    rng = np.random.default_rng(3)
    for n in list(range(1, 40)) + [767, 768, 1000, 4097]:
        x = rng.exponential(0.3, n).astype(np.float32)
        for q in (0.5, 0.9, 0.99):
            got, want = N.quantile(x, q), T.quantile(torch.from_numpy(x), q).item()
            assert abs(got - want) <= quantile_tolerance(x, q, want), (n, q, got, want)


def test_quantile_interpolates_linearly():
    # 768 entries, 720 zeros then 48 ones: position 0.99 * 767 = 759.33 lies between two ones
    x = np.concatenate([np.zeros(720, np.float32), np.ones(48, np.float32)])
    assert N.quantile(x, 0.99) == T.quantile(torch.from_numpy(x), 0.99).item() == 1.0


@pytest.mark.parametrize("case", range(6))
def test_clamped_is_torch_s(case):
    p, q = inputs()[case]
    with np.errstate(invalid="ignore", over="ignore"):
        ratios = [N.kl_log_ratio(p, q), N.tis_log_ratio(p, q)]
    want = T.clamped([torch.from_numpy(r) for r in ratios]).item()
    assert N.clamped(ratios) == want
    assert N.clamped([]) == T.clamped([]).item() == 0


def test_a_nan_stays_the_running_maximum():
    assert N.later(1.0, NAN) and N.later(1.0, 2.0)
    assert not N.later(NAN, 5.0) and not N.later(NAN, NAN) and not N.later(2.0, 1.0)
