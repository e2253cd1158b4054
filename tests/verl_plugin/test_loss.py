"""verl's `nanscope` loss mode against verl's own modes: bit for bit on healthy batches, finite on every hazard.

Needs verl (the verl environment, .ci/run's verl tier); plain `pytest` without verl skips this module.
"""

import math

import pytest

verl = pytest.importorskip("verl")

import torch  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

from nanscope.verl_plugin.loss import GuardedLoss  # noqa: E402
from nanscope.verl_plugin.record import Call, opened  # noqa: E402

# every mode verl v0.9.0 registers that a policy loss config can run alone (bypass_mode needs rollout correction)
MODES = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo")
AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")
EXP_MODES = ("clip_cov", "kl_cov")  # exp of the masked log-ratio unclamped (core_algos.py:1797, 1890)


def _config(agg="token-mean"):
    # clip_cov/kl_cov ratios high enough that their covariance selection (and clip_cov's randperm) runs on 24 tokens
    loss = PolicyLossConfig(clip_cov_ratio=0.2, clip_cov_lb=-10.0, clip_cov_ub=10.0, kl_cov_ratio=0.2, dro_beta=0.1)
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg,
                       policy_loss=loss)  # fmt: skip


def _batch(seed=0, b=4, t=6, weights=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, generator=g)
    log_prob = torch.nn.functional.logsigmoid(logits)
    old = log_prob + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, 1, generator=g).expand(b, t).clone()
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:1, 4:] = False  # a padded tail
    mask[2:3, 1] = False  # a masked tool token
    out = {"old_log_prob": old, "logits": logits, "advantages": adv, "response_mask": mask}
    if weights:
        out["rollout_is_weights"] = torch.rand(b, t, generator=g) + 0.5
    return out


def _run(fn, batch, agg="token-mean", seed=1):
    """(loss, metrics, d loss / d logits) of `fn` on `batch`, with torch's RNG seeded (clip_cov draws randperm)."""
    logits = batch["logits"].clone().requires_grad_()
    log_prob = torch.nn.functional.logsigmoid(logits)
    torch.manual_seed(seed)
    loss, metrics = fn(
        old_log_prob=batch["old_log_prob"], log_prob=log_prob, advantages=batch["advantages"],
        response_mask=batch["response_mask"], loss_agg_mode=agg, config=_config(agg),
        rollout_is_weights=batch.get("rollout_is_weights"),
    )  # fmt: skip
    loss.backward()
    return loss.detach(), metrics, logits.grad


def _guarded(inner):
    return GuardedLoss(inner=inner, lookup=core_algos.get_policy_loss_fn)


def _same(a, b):
    """Equal bit for bit, NaNs in the same places."""
    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weights", [False, True])
def test_healthy_batches_give_the_inner_modes_loss_metrics_and_gradient_bit_for_bit(mode, weights):
    for seed in range(3):
        batch = _batch(seed=seed, weights=weights)
        want = _run(core_algos.get_policy_loss_fn(mode), batch)
        got = _run(_guarded(mode), batch)
        assert _same(got[0], want[0]), (mode, seed, got[0], want[0])
        assert got[1] == want[1], (mode, seed)
        assert _same(got[2], want[2]), (mode, seed)


@pytest.mark.parametrize("agg", AGG)
def test_healthy_batches_are_bit_for_bit_under_every_aggregation(agg):
    for mode in ("vanilla", "clip_cov", "gspo"):
        batch = _batch(seed=5)
        want = _run(core_algos.get_policy_loss_fn(mode), batch, agg=agg)
        got = _run(_guarded(mode), batch, agg=agg)
        assert _same(got[0], want[0]) and _same(got[2], want[2]), (mode, agg)


def _planted(changes):
    batch = _batch(seed=3)
    for (key, i, j), value in changes.items():
        batch[key] = batch[key].clone()
        batch[key][i, j] = value
    return batch


@pytest.mark.parametrize("mode", EXP_MODES)
def test_a_masked_log_ratio_past_88_72_is_nan_in_verl_and_the_unplanted_run_with_the_guard(mode):
    planted = _planted({("old_log_prob", 2, 1): -100.0})  # masked token, log-ratio ~ 95
    bare = _run(core_algos.get_policy_loss_fn(mode), planted)
    assert not torch.isfinite(bare[2]).all(), "verl's own mode is not NaN here: the hazard moved"
    got = _run(_guarded(mode), planted)
    want = _run(core_algos.get_policy_loss_fn(mode), _batch(seed=3))
    assert _same(got[0], want[0]) and _same(got[2], want[2])


def test_geo_mean_over_a_trained_sequence_past_88_72_is_inf_in_verl_and_finite_with_the_guard():
    # geo_mean multiplies by the mask before its exp (core_algos.py:1983): a masked token cannot overflow it, but
    # a sequence with a negative advantage whose mean log-ratio passes 88.72 does (the clip takes the max side)
    batch = _batch(seed=3)
    batch["old_log_prob"] = batch["old_log_prob"].clone()
    batch["advantages"] = batch["advantages"].clone()
    batch["old_log_prob"][3] = -100.0
    batch["advantages"][3] = -1.0
    bare = _run(core_algos.get_policy_loss_fn("geo_mean"), batch)
    assert not (torch.isfinite(bare[0]) and torch.isfinite(bare[2]).all())
    loss, _, grad = _run(_guarded("geo_mean"), batch)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "plant",
    [
        {("old_log_prob", 1, 2): float("nan")},  # a trained token: dropped
        {("old_log_prob", 1, 2): float("inf")},
        {("old_log_prob", 1, 2): -float("inf")},
        {("advantages", 2, 1): float("nan")},  # a masked token: NaN * 0 in verl's backward
        {("advantages", 0, 5): float("inf")},
        {("old_log_prob", 3, 0): -200.0},  # a trained token past 88.72
        {("old_log_prob", 3, 0): 200.0},
        {("advantages", 2, 1): 3e38},  # huge masked: times a ratio is inf, times the mask NaN in seq-mean
    ],
)
def test_every_hazard_gives_a_finite_loss_and_gradient(mode, plant):
    for agg in ("token-mean", "seq-mean-token-mean"):
        loss, _, grad = _run(_guarded(mode), _planted(plant), agg=agg)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), (mode, plant, agg, loss)


@pytest.mark.parametrize("mode", MODES)
def test_a_dropped_token_is_the_same_as_that_token_masked(mode):
    planted = _planted({("old_log_prob", 1, 2): float("nan")})
    masked = _batch(seed=3)
    masked["response_mask"] = masked["response_mask"].clone()
    masked["response_mask"][1, 2] = False
    got, want = _run(_guarded(mode), planted), _run(core_algos.get_policy_loss_fn(mode), masked)
    assert _same(got[0], want[0]) and _same(got[2], want[2]), mode


@pytest.mark.parametrize("mode", ("vanilla", "clip_cov", "gspo", "geo_mean"))
def test_all_masked_and_nonfinite_everywhere_is_finite(mode):
    batch = _batch(seed=4)
    batch["response_mask"] = torch.zeros_like(batch["response_mask"])
    loss, _, grad = _run(_guarded(mode), batch)
    assert torch.isfinite(grad).all()
    batch = _batch(seed=4)
    batch["old_log_prob"] = torch.full_like(batch["old_log_prob"], float("nan"))
    batch["advantages"] = torch.full_like(batch["advantages"], float("-inf"))
    loss, _, grad = _run(_guarded(mode), batch)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("mode", ("vanilla", "clip_cov", "gspo"))
def test_an_empty_batch_does_what_the_inner_mode_does(mode):
    batch = _batch(seed=0, b=0)
    try:
        want = _run(core_algos.get_policy_loss_fn(mode), batch)
    except Exception as e:  # the inner mode refuses it: so must the guarded one, with the same error
        with pytest.raises(type(e)):
            _run(_guarded(mode), batch)
        return
    got = _run(_guarded(mode), batch)
    assert _same(got[0], want[0]) and got[1] == want[1]


def test_the_record_gets_the_headroom_and_the_metrics_stay_the_inner_modes():
    planted = _planted({("old_log_prob", 2, 1): -100.0})
    call = Call(microbatch=0)
    with opened(call):
        _, metrics, _ = _run(_guarded("vanilla"), planted)
    _, want, _ = _run(core_algos.get_policy_loss_fn("vanilla"), planted)
    assert metrics == want
    h = call.headroom
    assert 94 < float(h.max_log_ratio) < 100 and int(h.sample) == 2
    assert float(h.overflow) == 1 and float(h.clamped) == 1
    assert set(call.inputs) == {"old_log_prob", "log_prob", "advantages", "response_mask"}
    assert not math.isnan(float(h.max_log_ratio))
