"""The step's vote: one all-gather of every rank's row; maxima over DP x CP on the last stage, as maxima."""

import math
import subprocess
import sys
import textwrap

import pytest

from nanscope.slime_plugin import headroom, step_vote

INF = float("inf")


def row(rank, *, bad=False, last=True, tp=0, kl=-INF, gap=(0.0, 0.0, -INF, -INF), clamped=0.0, sample=-1.0):
    values = dict.fromkeys(headroom.FIELDS, -1.0)
    for m in headroom.MAXIMA:
        values[f"{m}_value"] = -INF
    values["kl_value"], values["kl_microbatch"], values["kl_sample"] = kl, 0.0 if kl != -INF else -1.0, sample
    values["gap_sum"], values["gap_count"], values["gap_p99"], values["gap_value"] = gap
    values["clamped"], values["nonfinite_inputs"] = clamped, 0.0
    return {"bad": float(bad), "rank": float(rank), "last_stage": float(last), "tp": float(tp), **values}


def test_a_maximum_is_the_maximum_of_the_group_with_its_rank_and_sample():
    rows = [row(0, kl=3.0, sample=1), row(1, kl=91.5, sample=4), row(2, kl=12.0), row(3, kl=2.0)]
    vote = step_vote.decide(rows)
    assert vote.metrics["nanscope/max_kl_log_ratio"] == 91.5
    assert vote.where["nanscope/max_kl_log_ratio"] == {"rank": 1, "microbatch": 0, "sample": 4}
    assert not vote.bad and vote.bad_ranks == ()


def test_only_the_last_stage_of_tp_rank_0_counts_and_a_nan_is_the_largest():
    rows = [row(0, last=False, kl=500.0), row(1, tp=1, kl=400.0), row(2, kl=7.0), row(3, kl=float("nan"), bad=True)]
    vote = step_vote.decide(rows)
    assert (
        math.isnan(vote.metrics["nanscope/max_kl_log_ratio"]) and vote.where["nanscope/max_kl_log_ratio"]["rank"] == 3
    )
    assert vote.bad_ranks == (3,)


def test_the_gap_mean_is_from_sums_and_counts_and_p99_is_the_largest_ranks():
    # rank 0: 10 tokens summing to 5 (p99 0.9, max 1.0); rank 1: 30 tokens summing to 3 (p99 0.2, max 0.3)
    rows = [row(0, gap=(5.0, 10.0, 0.9, 1.0), clamped=2.0), row(1, gap=(3.0, 30.0, 0.2, 0.3), clamped=1.0)]
    m = step_vote.decide(rows).metrics
    assert m["nanscope/train_rollout_gap_mean"] == 8.0 / 40.0  # not the mean of the ranks' means (0.3)
    assert (m["nanscope/train_rollout_gap_p99"], m["nanscope/train_rollout_gap_max"]) == (0.9, 1.0)
    assert m["nanscope/clamped_tokens"] == 3.0


def test_nothing_measured_is_none():
    m = step_vote.decide([row(0)]).metrics
    assert m["nanscope/max_kl_log_ratio"] is None and m["nanscope/train_rollout_gap_mean"] is None


GUARD = ("nan_guard/rollout_log_probs", "nan_guard/dropped_tokens")


def counted(r, n, **counts):
    return {**r, "counted": float(n), **{name: float(counts.get(name.split("/")[1], 0.0)) for name in GUARD}}


def test_a_counter_block_is_summed_over_the_group_and_none_where_nothing_was_counted():
    rows = [
        counted(row(0), 2, rollout_log_probs=1.0, dropped_tokens=1.0),
        counted(row(1), 2, dropped_tokens=3.0),
        counted(row(2, tp=1), 2, dropped_tokens=3.0),  # rank 1's TP peer: the same loss, counted once
        counted(row(3, last=False), 0),  # a stage without the loss
    ]
    m = step_vote.decide(rows, GUARD).metrics
    assert (m["nanscope/nan_guard/rollout_log_probs"], m["nanscope/nan_guard/dropped_tokens"]) == (1.0, 4.0)
    none = step_vote.decide([counted(row(0), 0), counted(row(1), 0)], GUARD).metrics
    assert none["nanscope/nan_guard/dropped_tokens"] is None  # the plugin's loss did not run: not 0, nothing
    assert "nanscope/nan_guard/dropped_tokens" not in step_vote.decide([row(0)]).metrics  # no block, no metric


def test_counters_total_adds_the_steps_calls_on_the_device():
    import torch

    parts = [torch.tensor([1.0, 0.0]), torch.tensor([2.0, 5.0])]
    total = step_vote.Counters.total(GUARD, parts, torch.device("cpu"))
    assert total.values.tolist() == [3.0, 5.0] and total.counted == 2
    empty = step_vote.Counters.total(GUARD, [], "meta")
    assert empty.values.is_meta and empty.values.shape == (2,) and empty.counted == 0


WORKER = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist

    rank = int(sys.argv[1])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=4)
    from nanscope.slime_plugin import headroom, step_vote
    from nanscope.slime_plugin.coords import Coords

    # DP 2 x CP 2, all on the last stage (TP 1): rank 2 holds the planted maximum, at micro-batch 1, sample 5
    values = dict.fromkeys(headroom.FIELDS, -1.0)
    for m in headroom.MAXIMA:
        values[f"{m}_value"] = float("-inf")
    values.update(gap_sum=0.0, gap_count=0.0, gap_p99=float("-inf"), clamped=0.0, nonfinite_inputs=0.0)
    values.update(ppo_value=float(rank), ppo_microbatch=0.0, ppo_sample=0.0)
    if rank == 2:
        values.update(ppo_value=95.0, ppo_microbatch=1.0, ppo_sample=5.0)
    row = torch.tensor([values[f] for f in headroom.FIELDS])
    # each rank dropped `rank` tokens over 2 micro-batches, rank 1 none at all (its loss did not run)
    parts = [torch.tensor([0.0, float(rank)]), torch.tensor([0.0, 0.0])] if rank != 1 else []
    block = step_vote.Counters.total(("nan_guard/log_probs", "nan_guard/dropped_tokens"), parts, "cpu")
    vote = step_vote.exchange(rank == 3, Coords(rank=rank), row, counters=block)
    print(vote.metrics["nanscope/max_ppo_log_ratio"], vote.where["nanscope/max_ppo_log_ratio"], vote.bad_ranks,
          vote.metrics["nanscope/nan_guard/dropped_tokens"], vote.metrics["nanscope/nan_guard/log_probs"])
    """
)


@pytest.mark.slow  # 4 processes: the fast tier checks the vote above, its exchange in tests/slime_plugin/test_rerun.py
def test_across_dp2_cp2_every_rank_gets_the_planted_maximum_of_one_rank_and_the_counters_sum():
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(r), "29631"], stdout=subprocess.PIPE, text=True)
        for r in range(4)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["95.0 {'rank': 2, 'microbatch': 1, 'sample': 5} (3,) 5.0 0.0"] * 4  # 0 + 2 + 3 tokens dropped
