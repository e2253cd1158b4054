"""fp32's limits, written without torch, are torch's."""

import math

import pytest
import torch

from nanscope.facts import numerics


def test_fp32_max_is_torchs():
    assert numerics.FP32_MAX == torch.finfo(torch.float32).max
    assert numerics.FP32_EXP_MAX == math.log(torch.finfo(torch.float32).max)


def test_fp32_exp_max_is_the_overflow_threshold():
    # exp just below the threshold is finite in fp32, just above it is inf.
    assert numerics.FP32_EXP_MAX == pytest.approx(88.7228, abs=1e-4)
    assert torch.isfinite(torch.tensor(numerics.FP32_EXP_MAX - 1e-3).exp())
    assert torch.isinf(torch.tensor(numerics.FP32_EXP_MAX + 1e-3).exp())


def test_the_clamp_bound_is_far_below_overflow():
    assert math.exp(numerics.LOG_RATIO_BOUND) < 1e9 and numerics.LOG_RATIO_BOUND < numerics.FP32_EXP_MAX / 4
