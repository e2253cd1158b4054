"""nanscope.slime_plugin.policy_loss without slime installed: the guard around nanscope's model of slime
v0.1.0 (nanscope.loss.as_is), called the way slime's loss_function calls a custom loss.

tests/slime_releases runs the same plugin inside the real releases (v0.1.0, v0.2.4, v0.3.1, main).
"""

import math
import types

import pytest
import torch
import torch.utils.checkpoint

from nanscope import case, equivalence, hazards, slime_plugin
from nanscope.causes import catalogue
from nanscope.facts import paths
from nanscope.loss import as_is, layout, microbatch
from nanscope.loss import guard as plugin_loss
from nanscope.loss import target as releases
from nanscope.loss.microbatch import Parallel
from nanscope.slime_plugin import state
from nanscope.slime_plugin.loss_watch import LossWatch

PLUGIN = paths.LOSS_FUNCTION_PATH


@pytest.fixture(autouse=True)
def fresh_installation(monkeypatch):
    # the plugin reads its settings once per installation: each test starts one from its own environment
    monkeypatch.delenv("NANSCOPE_NAN_POLICY", raising=False)
    slime_plugin.uninstall()
    yield
    slime_plugin.uninstall()


def hazard_batch(name, seed=0, defused=False, temperature=None):
    policy = hazards.synthetic_policy(512, seed)
    batch = hazards.build(name, policy, case.rollout(512, seed), seed, temperature, defused)
    return batch, hazards.packed_logits(policy, batch["unconcat_tokens"])


def through_slime(args, batch, logits, custom: bool):
    """slime v0.1.0's loss_function (nanscope's model of it), with its own loss or with the plugin."""
    if custom:
        args.loss_type, args.custom_loss_function_path = "custom_loss", PLUGIN
    x = logits.clone().requires_grad_(True)
    loss, _, log = as_is.loss_function(args, batch, 1, x, parallel=Parallel())
    loss.backward()
    return loss.detach(), x.grad, log["keys"], log["values"]


FLAG_SETS = [{}] + [equivalence.random_case(seed).flags for seed in range(6)]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=[f"flags{i}" for i in range(len(FLAG_SETS))])
def test_healthy_batches_give_as_is_bitwise_plus_zero_guard_counters(flags):
    args = case.args(global_batch_size=8, **flags)
    batch, logits = hazard_batch("healthy", temperature=args.rollout_temperature)
    g = torch.Generator().manual_seed(1)  # old != current policy: ratios away from 1, the clip binds somewhere
    batch["log_probs"] = [x + 0.3 * torch.randn(x.shape, generator=g) for x in batch["log_probs"]]
    own = through_slime(args, batch, logits, custom=False)
    plugin = through_slime(case.args(global_batch_size=8, **flags), batch, logits, custom=True)
    assert own[3][own[2].index("pg_clipfrac") + 1] > 0
    assert torch.equal(plugin[0], own[0]) and torch.equal(plugin[1], own[1])
    n = len(own[2])
    assert plugin[2][:n] == own[2] and all(k.startswith("nan_guard/") for k in plugin[2][n:])
    assert torch.equal(plugin[3][: n + 1], own[3]) and set(plugin[3][n + 1 :].tolist()) == {0.0}


@pytest.mark.parametrize("name", [h.name for h in catalogue.CATALOGUE if h.level == "batch" and h.safe_finite])
def test_every_hazard_is_finite_and_a_masked_one_leaves_the_step_as_its_defused_twin(name):
    batch, logits = hazard_batch(name)
    loss, grad, keys, values = through_slime(case.args(global_batch_size=8), batch, logits, custom=True)
    assert torch.isfinite(loss) and torch.isfinite(grad).all() and torch.isfinite(values).all()
    if catalogue.get(name).masked_token:
        twin, _ = hazard_batch(name, defused=True)
        own = through_slime(case.args(global_batch_size=8), twin, logits, custom=False)
        assert torch.equal(loss, own[0]) and torch.equal(grad, own[1])


@pytest.mark.parametrize(
    "name, counter",
    [
        ("kl-exp-overflow", "nan_guard/exp_overflow"),
        ("ratio-exp-overflow", "nan_guard/exp_overflow"),
        ("nan-rollout-logprob", "nan_guard/rollout_log_probs"),
        ("nan-reward", "nan_guard/advantages"),
    ],
)
def test_the_guard_counts_what_it_neutralised(name, counter):
    batch, logits = hazard_batch(name)
    _, metrics = slime_plugin.policy_loss(
        case.args(global_batch_size=8),
        batch,
        logits.requires_grad_(True),
        microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False),
    )
    expected = {"nan_guard/advantages": 8.0}.get(counter, 1.0)  # a NaN reward takes its whole group of 8
    assert metrics[counter].item() == expected
    others = {
        k: v.item()
        for k, v in metrics.items()
        if k.startswith("nan_guard/") and k not in (counter, "nan_guard/dropped_tokens")
    }
    assert set(others.values()) == {0.0}, others


def test_a_non_finite_ref_logprob_is_not_counted_as_an_overflow():
    batch, logits = hazard_batch("healthy")
    i = 1
    j = int((batch["loss_masks"][i] == 0).nonzero()[0])
    batch["ref_log_probs"][i][j] = float("inf")  # exp(inf - logp) would be inf, but it is bad input, not overflow
    _, metrics = slime_plugin.policy_loss(
        case.args(global_batch_size=8),
        batch,
        logits,
        microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False),
    )
    assert (metrics["nan_guard/ref_log_probs"].item(), metrics["nan_guard/exp_overflow"].item()) == (1.0, 0.0)


def test_an_unmasked_nan_logprob_leaves_the_loss_and_the_callers_batch_is_untouched():
    batch, logits = hazard_batch("healthy")
    i, j = 2, 0  # response token 0 of sample 2 is a model token (loss_mask 1)
    assert batch["loss_masks"][i][j] == 1
    batch["log_probs"][i][j] = float("nan")
    batch["loss_masks"] = [m.int() for m in batch["loss_masks"]]  # slime's actor moves them to int
    before = {k: [t.clone() for t in batch[k]] for k in ("log_probs", "loss_masks")}
    loss, grad, keys, values = through_slime(case.args(global_batch_size=8), batch, logits, custom=True)
    assert torch.isfinite(grad).all()
    row = sum(batch["total_lengths"][:i]) + batch["total_lengths"][i] - batch["response_lengths"][i] - 1 + j
    assert torch.equal(grad[0, row], torch.zeros_like(grad[0, row]))  # the token gets no gradient
    metrics = dict(zip(keys, values[1:].tolist()))
    assert metrics["nan_guard/log_probs"] == 1.0 and metrics["nan_guard/dropped_tokens"] == 1.0
    for k, tensors in before.items():  # the plugin worked on a copy
        for a, b in zip(batch[k], tensors):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert math.isnan(batch["log_probs"][i][j]) and batch["loss_masks"][i][j] == 1


def test_a_finite_batch_reaches_the_release_bit_for_bit(monkeypatch):
    """No branch on the data (a branch would be a host sync): a finite batch takes the same selections as a hazard's,
    and what reaches the release equals it bit for bit."""
    import functools

    seen = []
    original = as_is.policy_loss

    @functools.wraps(original)
    def spy(args, batch, *rest, **kwargs):
        seen.append(batch)
        return original(args, batch, *rest, **kwargs)

    monkeypatch.setattr(as_is, "policy_loss", spy)
    healthy, logits = hazard_batch("healthy")
    hazard, _ = hazard_batch("nan-rollout-logprob")
    ssm = microbatch.make_sum_of_sample_mean(healthy, Parallel(), False, select=False)
    slime_plugin.policy_loss(case.args(global_batch_size=8), healthy, logits, ssm)
    slime_plugin.policy_loss(case.args(global_batch_size=8), hazard, logits, ssm)
    for key in ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "loss_masks"):
        assert len(seen[0][key]) == len(healthy[key]), key
        for got, want in zip(seen[0][key], healthy[key]):
            want = torch.as_tensor(want)
            assert got.dtype == want.dtype and torch.equal(got, want), key
    i, j = hazard["hazard_site"]
    assert seen[1] is not hazard and seen[1]["rollout_log_probs"][i][j] == 0 and seen[1]["loss_masks"][i][j] == 0


def test_patched_helpers_are_restored_after_the_call_and_after_an_exception():
    names = list(releases.MODEL.clamps)
    originals = {n: getattr(as_is, n) for n in names}
    batch, logits = hazard_batch("kl-exp-overflow")
    ssm = microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False)
    slime_plugin.policy_loss(case.args(global_batch_size=8), batch, logits, ssm)
    assert {n: getattr(as_is, n) for n in names} == originals
    with pytest.raises(ValueError, match="advantage_estimator 'gspo'"):  # raised by as_is inside the call
        slime_plugin.policy_loss(case.args(global_batch_size=8, advantage_estimator="gspo"), batch, logits, ssm)
    assert {n: getattr(as_is, n) for n in names} == originals


@pytest.mark.parametrize("reentrant", [True, False])
def test_recompute_loss_function_gives_the_same_gradient_and_records_the_batch_once(reentrant):
    # --recompute-loss-function: slime v0.2.x calls the custom loss through torch.utils.checkpoint
    batch, logits = hazard_batch("kl-exp-overflow")
    ssm = microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False)
    args = case.args(global_batch_size=8)
    watch = LossWatch(releases.model())  # what the hook on the model keeps of this step's loss calls
    state.installation().hook = types.SimpleNamespace(losses=watch)
    grads = []
    for recompute in (False, True):
        x = logits.clone().requires_grad_(True)
        if recompute:
            loss, _ = torch.utils.checkpoint.checkpoint(
                slime_plugin.policy_loss, args, batch, x, ssm, use_reentrant=reentrant
            )
        else:
            loss, _ = slime_plugin.policy_loss(args, batch, x, ssm)
        loss.backward()
        grads.append(x.grad)
    assert torch.isfinite(grads[1]).all() and torch.equal(grads[0], grads[1])
    assert [seen.batch for seen in watch.seen] == [batch] and watch.seen[0].batch is batch
    overflow = plugin_loss.COUNTERS.index("exp_overflow")
    assert watch.seen[0].counts[overflow] == 1.0  # the recomputation's counts replaced the first call's: not 2
    state.installation().hook = None
    watch.remove()


def test_strict_policy_names_the_sample_and_token(monkeypatch):
    monkeypatch.setenv("NANSCOPE_NAN_POLICY", "strict")
    batch, logits = hazard_batch("nan-reward")
    ssm = microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False)
    with pytest.raises(plugin_loss.NonFiniteInputError) as e:
        slime_plugin.policy_loss(case.args(global_batch_size=8), batch, logits, ssm)
    assert str(e.value) == "advantages is nan at sample 0, response token 0 (nan_policy=strict)"


def test_an_unknown_nan_policy_is_refused(monkeypatch):
    monkeypatch.setenv("NANSCOPE_NAN_POLICY", "ignore")
    batch, logits = hazard_batch("healthy")
    with pytest.raises(ValueError, match="^NANSCOPE_NAN_POLICY='ignore': expected one of drop, strict$"):
        slime_plugin.policy_loss(case.args(global_batch_size=8), batch, logits, None)


def test_under_cp_a_dropped_token_is_cut_at_its_own_response_position():
    # A NaN old log-prob on a trained token: the CP ranks' gradients add up to the single-process one,
    # and the token's logit row gets no gradient, so each rank cut the token at the right position.
    from nanscope.loss import safe

    batch, logits = hazard_batch("healthy")
    i, j = 3, int((batch["loss_masks"][3] == 1).nonzero()[-1])  # the last trained token of sample 3
    batch["log_probs"][i][j] = float("nan")
    args = case.args(global_batch_size=8)
    grads = {}
    for cp in (1, 2):
        full = logits.clone().requires_grad_(True)
        for r in range(cp):
            par = Parallel(cp_rank=r, cp_size=cp, dp_cp_size=cp)
            local = microbatch.cp_local_logits(full, batch["total_lengths"], par)
            loss, _, log = safe.loss_function(args, microbatch.slice_for_cp(batch, par), 1, local, parallel=par)
            loss.backward()
            dropped = dict(zip(log["keys"], log["values"][1:].tolist()))["nan_guard/dropped_tokens"]
            assert dropped == (
                1.0
                if cp == 1
                or j in layout.response_positions(batch["total_lengths"][i], batch["response_lengths"][i], r, cp)
                else 0.0
            )
        grads[cp] = full.grad / cp  # each CP rank's loss is scaled by dp_cp = cp
    row = sum(batch["total_lengths"][:i]) + batch["total_lengths"][i] - batch["response_lengths"][i] - 1 + j
    assert torch.isfinite(grads[2]).all() and grads[2][0, row].abs().max() == 0
    torch.testing.assert_close(grads[2], grads[1], rtol=1e-5, atol=1e-7)


def test_runs_of_positions():
    assert plugin_loss._runs([3, 4, 5, 9]) == [(3, 6), (9, 10)]
    assert plugin_loss._runs([]) == []
    assert plugin_loss._runs(layout.response_positions(10, 6, 1, 2)) == [(0, 6)]


def _with_record(fn):
    """`fn()` with the hook's record of the step's loss calls open (the LossWatch the hook keeps): its records."""
    watch = LossWatch(releases.model())
    state.installation().hook = types.SimpleNamespace(losses=watch)
    try:
        fn()
        return watch.seen
    finally:
        state.installation().hook = None
        watch.remove()


@pytest.mark.parametrize("name", ["nan-rollout-logprob", "nan-reward", "kl-exp-overflow", "healthy"])
def test_with_the_hook_the_counters_ride_on_the_record_and_the_metrics_are_the_releases(name):
    # no nan_guard/* in slime's metrics (its packing would read each to the host): the record carries the same
    # counts as one device tensor, for the step's vote
    batch, logits = hazard_batch(name)
    args = case.args(global_batch_size=8)
    alone = through_slime(case.args(global_batch_size=8), batch, logits, custom=True)
    (record,) = _with_record(lambda: through_slime(args, batch, logits, custom=True))
    counts = dict(zip(plugin_loss.METRICS, record.counts.tolist()))
    metrics = dict(zip(alone[2], alone[3][1:].tolist()))
    assert {k: counts[k] for k in metrics if k.startswith("nan_guard/")} == {
        k: v for k, v in metrics.items() if k.startswith("nan_guard/")
    }
    assert record.counts.shape == (len(plugin_loss.COUNTERS),) and record.counts.dtype == torch.float32


def test_with_the_hook_slimes_metrics_are_its_own_and_the_loss_and_gradient_unchanged():
    batch, logits = hazard_batch("nan-rollout-logprob")
    alone = through_slime(case.args(global_batch_size=8), batch, logits, custom=True)
    results = []
    _with_record(lambda: results.append(through_slime(case.args(global_batch_size=8), batch, logits, custom=True)))
    (hooked,) = results
    own = through_slime(case.args(global_batch_size=8), batch, logits, custom=False)
    assert hooked[2] == own[2] and not any(k.startswith("nan_guard/") for k in hooked[2])
    assert torch.equal(hooked[0], alone[0]) and torch.equal(hooked[1], alone[1])
    n = len(own[2]) + 1
    assert torch.equal(hooked[3], alone[3][:n])  # the release's metrics, the same values


def test_under_cp_a_nan_reward_group_is_counted_once_over_the_cp_ranks():
    # every sample of the group has a NaN advantage on every CP rank holding its tokens: each sample counts on the
    # rank holding its last response token only, so the CP ranks' counts add up to 8 samples, as without CP
    batch, logits = hazard_batch("nan-reward")
    totals = {}
    for cp in (1, 2):
        counts = []
        for r in range(cp):
            par = Parallel(cp_rank=r, cp_size=cp, dp_cp_size=cp)
            local = microbatch.cp_local_logits(logits, batch["total_lengths"], par)
            sliced = microbatch.slice_for_cp(batch, par)
            ssm = microbatch.make_sum_of_sample_mean(sliced, par, False, select=False)
            _, _, c = plugin_loss.guarded(
                releases.model(), case.args(global_batch_size=8), sliced, local, ssm, parallel=par
            )
            counts.append(c)
        totals[cp] = dict(zip(plugin_loss.COUNTERS, torch.stack(counts).sum(0).tolist()))
    assert totals[1]["advantages"] == totals[2]["advantages"] == 8.0
    assert totals[1]["dropped_tokens"] == totals[2]["dropped_tokens"] > 0
