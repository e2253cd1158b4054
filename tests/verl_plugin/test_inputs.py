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


def test_a_healthy_mini_batch_keeps_every_bit_and_counts_nothing_but_masked_ref_log_probs_are_zero():
    data = _data()
    before = {k: v.clone() for k, v in data.items()}
    counts = inputs.clean(data)
    for k, v in before.items():
        want = torch.where(before["response_mask"].bool(), v, 0.0) if k in inputs.SELECTED else v
        assert torch.equal(data[k], want) and data[k].dtype == v.dtype, k
    assert data["ref_log_prob"][0, 3] == 0 and before["ref_log_prob"][0, 3] != 0
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


# --- the KL term (use_kl_loss): verl's own ops, as ppo_loss runs them on the cleaned mini-batch (losses.py:132-141)
KL_TYPES = ("kl", "k1", "abs", "k2", "mse", "low_var_kl", "k3", "k3+", "low_var_kl+")
KL_AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")


def _kl(data, kl_type, agg, log_prob=None):
    """(the KL loss, d loss / d log_prob) through verl's kl_penalty and agg_loss on `data`'s padded [B, T] fields."""
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    if log_prob is None:
        log_prob = data["old_log_probs"] + 0.1
    log_prob = log_prob.clone().requires_grad_()
    kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=kl_type)
    loss = agg_loss(loss_mat=kld, loss_mask=data["response_mask"].bool(), loss_agg_mode=agg)
    loss.backward()
    return loss.detach(), log_prob.grad


@pytest.mark.parametrize("agg", KL_AGG)
@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_a_nonfinite_or_huge_ref_log_prob_at_a_masked_token_leaves_the_kl_term_as_the_healthy_batchs(kl_type, agg):
    healthy = _data()
    want_loss, want_grad = _kl(_cleaned(healthy.clone()), kl_type, agg)
    assert torch.isfinite(want_loss) and torch.isfinite(want_grad).all()
    for planted in (NAN, INF, -INF, -3e38, 3e38):
        data = _data()
        data["ref_log_prob"][0, 3] = planted  # masked (response_mask 0)
        loss, grad = _kl(_cleaned(data), kl_type, agg)
        assert torch.equal(loss, want_loss) and torch.equal(grad, want_grad), (planted, loss, want_loss)


def _cleaned(data):
    inputs.clean(data)
    return data


def test_without_the_cleaning_verls_kl_term_is_not_finite_there():
    # the baseline the cleaning guards against (shared/research/verl-plugin.md §1): k2's gradient at a masked NaN,
    # and a huge masked value under seq-mean-*, whose aggregation multiplies by the mask (inf * 0)
    data = _data()
    data["ref_log_prob"][0, 3] = NAN
    assert not torch.isfinite(_kl(data, "k2", "token-mean")[1]).all()
    data["ref_log_prob"][0, 3] = -3e38
    assert not torch.isfinite(_kl(data, "k2", "seq-mean-token-mean")[0])


def test_a_nonfinite_ref_log_prob_at_a_trained_token_is_dropped_as_that_token_masked():
    data, masked = _data(), _data()
    data["ref_log_prob"][1, 2] = NAN
    masked["response_mask"][1, 2] = 0
    masked["loss_mask"][1, 2] = 0
    counts = _counts(inputs.clean(data))
    assert counts["nan_guard/ref_log_prob"] == 1 and counts["nan_guard/dropped_tokens"] == 1
    log_prob = _data()["old_log_probs"] + 0.1
    for kl_type in KL_TYPES:
        for agg in KL_AGG:
            got = _kl(data, kl_type, agg, log_prob)
            want = _kl(_cleaned(masked.clone()), kl_type, agg, log_prob)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (kl_type, agg)


def test_an_all_masked_mini_batch_has_every_ref_log_prob_zero():
    data = _data()
    data["response_mask"].zero_()
    data["loss_mask"].zero_()
    data["ref_log_prob"][1, 1] = NAN
    counts = _counts(inputs.clean(data))
    assert torch.equal(data["ref_log_prob"], torch.zeros(3, 4)) and counts["nan_guard/dropped_tokens"] == 0
