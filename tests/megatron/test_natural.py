"""The natural loop's per-rank pieces without a launch: what the loss saw, and each step's headroom from it."""

import math
from types import SimpleNamespace

import pytest
import torch

from nanscope import case, hazards
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.loss.microbatch import Parallel, log_probs_and_entropy
from nanscope.megatron import sampler
from nanscope.megatron.environment import ToolEnv
from nanscope.megatron.natural import NaturalLoop
from nanscope.natural import crossing

V = 512


def _loop_and_batch():
    """A loop on a stand-in rank (no model to speak of) and a sampled group's batch, old = rollout = ref."""
    ctx = SimpleNamespace(vocab_size=V, spec=SimpleNamespace(seed=0), loss_flags=case.loss_flags(),
                          model=torch.nn.Linear(2, 2))  # fmt: skip
    loop = NaturalLoop(ctx, None)
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0)) * 4
    group = sampler.sample_group(lambda seqs: torch.stack([table[int(s[-1])] for s in seqs]), loop.env, step=1,
                                 group_size=8, temperature=0.8, generator=torch.Generator().manual_seed(1))  # fmt: skip
    logp = [x.clone() for x in group.rollout_log_probs]
    batch = hazards.slime_batch(group.rollout, log_probs=[x.clone() for x in logp],
                                ref_log_probs=[x.clone() for x in logp], rollout_log_probs=logp,
                                rewards=group.rollout.rewards)  # fmt: skip
    loop.group = group
    return loop, batch, logp


def test_the_reference_model_is_the_initial_weights_and_the_environment_the_runs_seed():
    loop, _, _ = _loop_and_batch()
    assert loop.env == ToolEnv(vocab_size=V, seed=0) and loop.temperature == 0.8 and loop.group_size == 8
    assert set(loop.ref) == {"weight", "bias"}


def test_entry_is_every_exp_log_ratio_with_its_place():
    loop, batch, logp = _loop_and_batch()
    k, (start, stop) = 3, loop.group.spans[3]
    # the current policy has moved off a tool token: its log-prob 95 below the reference's
    current = [x.clone() for x in logp]
    current[k][start + 1] = batch["ref_log_probs"][k][start + 1] - 95.0
    loop.seen = {i: (current[i], torch.full_like(current[i], 0.5)) for i in range(8)}
    entry = loop.entry(batch, 4)
    assert entry["step"] == 4 and entry["rewards"] == batch["rewards"]
    assert entry["max_kl_log_ratio"] == pytest.approx(95.0, abs=1e-4)
    assert entry["at"]["max_kl_log_ratio"] == {
        "sample": k, "token": start + 1, "masked": True, "span": [start, stop],
        "log_prob": float(current[k][start + 1]), "ref_log_prob": float(batch["ref_log_probs"][k][start + 1]),
        "old_log_prob": float(batch["log_probs"][k][start + 1]),
    }  # fmt: skip
    # logp - old is -95 there, 0 elsewhere; old - rollout is what rounding rollout to bfloat16 left
    tis = max(float((old - roll.float()).max()) for old, roll in zip(batch["log_probs"], batch["rollout_log_probs"]))
    assert entry["max_ppo_log_ratio"] == 0.0 and entry["max_tis_log_ratio"] == tis
    assert entry["exp_overflow"] == 1  # 95 > 88.72 at one token
    assert entry["max_kl_log_ratio_trained"] == 0.0 and entry["entropy"] == 0.5
    tool_tokens = sum(b - a for a, b in loop.group.spans)
    assert entry["mean_kl_log_ratio_tool"] == pytest.approx(95.0 / tool_tokens, rel=1e-5)
    assert entry["min_tool_log_prob"] == float(current[k][start + 1])


def test_a_nan_log_ratio_is_the_maximum_and_its_place_is_named():
    loop, batch, logp = _loop_and_batch()
    current = [x.clone() for x in logp]
    current[6][2] = float("nan")  # a thinking token (before the tool's span at 8)
    loop.seen = {i: (current[i], torch.zeros_like(current[i])) for i in range(8)}
    entry = loop.entry(batch, 1)
    for name in ("max_kl_log_ratio", "max_ppo_log_ratio"):
        assert math.isnan(entry[name])
        assert (entry["at"][name]["sample"], entry["at"][name]["token"], entry["at"][name]["masked"]) == (6, 2, False)
    assert entry["at"]["max_kl_log_ratio"]["span"] is None


def test_entry_is_none_off_the_last_stage():
    loop, batch, _ = _loop_and_batch()
    assert loop.entry(batch, 1) is None  # the loss never ran here


def test_the_loss_function_is_the_runs_own_and_keeps_the_samples_log_probs():
    loop, batch, _ = _loop_and_batch()
    calls = []
    loop.module = SimpleNamespace(loss_function=lambda *a, **k: calls.append((a, k)) or "slime's result")
    k = 5
    mb = {key: [batch[key][k]] for key in ("unconcat_tokens", "total_lengths", "response_lengths", "loss_masks")}
    loop._samples = {id(t): i for i, t in enumerate(batch["unconcat_tokens"])}
    logits = torch.randn(1, batch["total_lengths"][k], V, requires_grad=True)
    args = case.args()
    assert loop.loss_function(args, mb, 8, logits) == "slime's result"
    assert calls == [((args, mb, 8, logits), {})]
    expected, ent = log_probs_and_entropy(logits.detach(), mb, 0.8, Parallel())
    assert list(loop.seen) == [k] and torch.equal(loop.seen[k][0], expected) and torch.equal(loop.seen[k][1], ent)
    assert not loop.seen[k][0].requires_grad


def _entry(step, kl=0.0, ppo=0.0, tis=0.0):
    at = {"sample": 0, "token": step, "masked": True, "span": [8, 12], "log_prob": -1.0, "ref_log_prob": -1.0,
          "old_log_prob": -1.0}  # fmt: skip
    values = {"max_kl_log_ratio": kl, "max_ppo_log_ratio": ppo, "max_tis_log_ratio": tis}
    return {"step": step, **values, "at": {name: dict(at) for name in values}}


def test_crossing_is_the_first_step_past_fp32_and_at_one_step_the_first_exp_slime_computes():
    assert crossing([_entry(1, kl=88.7), _entry(2, kl=FP32_EXP_MAX)]) is None  # not past it
    found = crossing([_entry(1, kl=60.0), _entry(2, kl=100.0, tis=90.0), _entry(3, ppo=120.0)])
    # step 2: TIS is computed before the KL (compute_policy_loss, TIS, then compute_approx_kl)
    assert (found["exp"], found["metric"], found["step"], found["log_ratio"]) == ("TIS", "max_tis_log_ratio", 2, 90.0)
    assert found["masked"] and found["span"] == [8, 12] and found["token"] == 2
    assert crossing([_entry(1, kl=90.0, ppo=89.0)])["exp"] == "PPO ratio"


@pytest.mark.slow  # the natural reproduction is the slow tier's (issue 30)
@pytest.mark.integration
@pytest.mark.timeout(180)
def test_two_steps_of_the_loop_on_one_rank(tmp_path):
    """The loop's rank side end to end at TP1 x PP1 (one process): sampling through the pipeline schedule, the
    reference model's pass with its weights swapped in, the actor's, training, the series."""
    from nanscope.megatron import launcher
    from nanscope.megatron.spec import Layout, RunSpec

    run = RunSpec(natural=True, steps=2, lr=1e-3, seed=4)
    launched = launcher.launch([run], Layout(tp=1, pp=1, cp=1), loss_flags=case.loss_flags(), timeout_s=150,
                               out_dir=tmp_path)  # fmt: skip
    (record,) = launched.runs[0].ranks
    assert record.ok and len(record.optimizer_grad_norm) == 2, launched.stderr_tail[-2000:]
    first, second = record.series
    assert [first["step"], second["step"]] == [1, 2] and len(first["rewards"]) == 8
    # step 1: the policy is the reference and the old policy (the same weights, passes and lengths), up to fp32's rounding
    assert 0.0 <= first["max_kl_log_ratio"] < 1e-5 and 0.0 <= first["max_ppo_log_ratio"] < 1e-5
    # the sampler's log-probs are the log-prob pass's up to the sampler's batch shape and rollout's bfloat16
    assert 0.0 <= first["max_tis_log_ratio"] < 0.5 and first["train_rollout_gap_max"] < 0.5
    # one optimizer step later the policy has left the reference, most on the tool's tokens it never trains
    assert second["max_kl_log_ratio"] > 1.0 and second["at"]["max_kl_log_ratio"]["masked"]
    assert 0.0 < first["entropy"] < 6.3  # nats, below log(512)
    assert record.hazard_sites == [None, None] and record.error is None
