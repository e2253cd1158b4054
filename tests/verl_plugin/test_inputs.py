"""nanscope.verl_plugin.inputs: a mini-batch's non-finite inputs replaced and dropped from both masks, counted.

Needs verl's environment (tensordict, verl); plain `pytest` without verl skips this module.
"""

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from nanscope.verl_plugin import inputs  # noqa: E402

NAN, INF = float("nan"), float("inf")


def _data(b=3, t=4):
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(b, t, dtype=torch.int64)
    mask[:1, 3] = 0
    d = {
        "old_log_probs": -torch.rand(b, t, generator=g),
        "advantages": torch.randn(b, t, generator=g),
        "ref_log_prob": -torch.rand(b, t, generator=g),
        "response_mask": mask,
        "loss_mask": mask.clone(),
    }
    return TensorDict(d, batch_size=[b])


def _counts(counts):
    return dict(zip(inputs.COUNTERS, counts.tolist()))


def test_a_healthy_mini_batch_keeps_every_bit_and_counts_nothing():
    data = _data()
    before = {k: v.clone() for k, v in data.items()}
    counts = inputs.clean(data)
    for k, v in before.items():
        assert torch.equal(data[k], v) and data[k].dtype == v.dtype, k
    assert set(_counts(counts).values()) == {0.0}


def test_nonfinite_entries_are_zeroed_dropped_from_both_masks_and_counted():
    data = _data()
    data["old_log_probs"][1, 2] = NAN  # trained
    data["advantages"][0, 3] = INF  # masked already
    data["ref_log_prob"][2, 0] = -INF  # trained
    counts = _counts(inputs.clean(data))
    for key in ("old_log_probs", "advantages", "ref_log_prob"):
        assert torch.isfinite(data[key]).all()
    assert data["old_log_probs"][1, 2] == 0 and data["advantages"][0, 3] == 0
    for name in ("response_mask", "loss_mask"):
        assert data[name][1, 2] == 0 and data[name][2, 0] == 0 and data[name][0, 3] == 0
        assert int(data[name].sum()) == 12 - 3
        assert data[name].dtype == torch.int64
    assert counts["nan_guard/old_log_probs"] == 1 and counts["nan_guard/advantages"] == 1
    assert counts["nan_guard/ref_log_prob"] == 1 and counts["nan_guard/rollout_log_probs"] == 0
    assert counts["nan_guard/dropped_tokens"] == 2  # the masked one was not trained
    assert counts["nan_guard/exp_overflow"] == 0
    assert float(inputs.nonfinite_entries(inputs.clean(_planted_twice()))) == 2


def _planted_twice():
    data = _data()
    data["old_log_probs"][0, 0] = NAN
    data["advantages"][0, 0] = NAN
    return data


def test_nested_inputs_are_cleaned_over_their_offsets():
    values = torch.tensor([-0.5, NAN, -0.25, -0.125, INF])
    offsets = torch.tensor([0, 2, 5])
    old = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    mask = torch.nested.nested_tensor_from_jagged(torch.ones(5, dtype=torch.bool), offsets=offsets)
    data = TensorDict({"old_log_probs": old, "response_mask": mask}, batch_size=[2])
    counts = _counts(inputs.clean(data))
    assert data["old_log_probs"].is_nested and torch.equal(data["old_log_probs"].offsets(), offsets)
    assert data["old_log_probs"].values().tolist() == [-0.5, 0.0, -0.25, -0.125, 0.0]
    assert data["response_mask"].values().tolist() == [True, False, True, True, False]
    assert counts["nan_guard/old_log_probs"] == 2 and counts["nan_guard/dropped_tokens"] == 2


def test_an_empty_mini_batch():
    data = _data(b=0)
    counts = inputs.clean(data)
    assert counts.shape == (len(inputs.COUNTERS),) and float(counts.sum()) == 0


def test_a_mini_batch_without_a_response_mask_is_left_alone():
    data = TensorDict({"values": torch.tensor([[NAN, 1.0]]), "returns": torch.tensor([[1.0, 2.0]])}, batch_size=[1])
    counts = inputs.clean(data)
    assert float(counts.sum()) == 0 and torch.isnan(data["values"][0, 0])
