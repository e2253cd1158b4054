"""The 4-process harness (TP2 x PP2, SP, gloo): one launch runs healthy, kl-exp-overflow, healthy.

Each launch costs seconds of imports and process-group start on 2 cores, so the runs share one launch
(the harness's reason to exist); each test still has its own hard timeout.
"""

import os

import pytest
import torch

from nanscope import case
from nanscope.megatron import launcher
from nanscope.megatron.run import checksum
from nanscope.megatron.spec import Layout, RunSpec

pytestmark = pytest.mark.integration


# `launched`: tests/megatron/conftest.py (one launch, also read by test_ray_launcher.py)


@pytest.mark.slow  # conftest's launch: the fast tier runs the harness through repro's default matrix
@pytest.mark.timeout(300)
def test_launch_finishes_and_reports_every_rank(launched):
    assert launched.ok, launched.stderr_tail
    assert launched.stuck == {}
    assert sorted(launched.startup) == [0, 1, 2, 3]
    # One agent imported megatron-core and forked the 4 ranks: one start time and import time for all.
    assert len({(s["started"], s["imports_s"]) for s in launched.startup.values()}) == 1
    for run in launched.runs:
        assert run.missing == []
        # Megatron's order tp-cp-ep-dp-pp: rank = tp + 2 * pp.
        assert [(r.rank, r.pp, r.tp) for r in run.ranks] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
        # 4 layers over 2 stages; only the last stage holds the output layer.
        assert [(r.layers, r.holds_output_layer) for r in run.ranks] == [
            ([0, 1], False),
            ([0, 1], False),
            ([2, 3], True),
            ([2, 3], True),
        ]


@pytest.mark.slow  # conftest's launch: the fast tier runs the harness through repro's default matrix
@pytest.mark.timeout(300)
def test_every_process_of_the_launch_sees_no_cuda_device(launched_watched):
    # The agent and the ranks it forks are started with CUDA hidden (nanscope.megatron.hidden_cuda): on a GPU node
    # the agent would otherwise initialise the CUDA driver before the fork, and every rank die in AdamW's step.
    launched, watch = launched_watched
    assert launched.ok, launched.stderr_tail
    assert len(watch.matching("-m nanscope.megatron.worker")) >= 5, watch.seen  # the agent and its 4 forked ranks
    for seen in watch.ours():
        assert seen.environ == {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                                "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": None}, seen  # fmt: skip
    assert not any(seen.cuda_driver for seen in watch.seen.values()), watch.seen
    # what each rank's torch reads, after torchrun's agent set the rank's variables
    assert {rank: s["cuda_visible_devices"] for rank, s in launched.startup.items()} == dict.fromkeys(range(4), "")


@pytest.mark.slow  # conftest's launch: the fast tier runs the harness through repro's default matrix
@pytest.mark.timeout(300)
def test_healthy_step_completes(launched):
    run = launched.runs[0]
    assert run.observed == "completed"
    for r in run.ranks:
        assert r.ok and r.error is None and r.params_finite
        assert len(r.optimizer_grad_norm) == 1 and r.optimizer_grad_norm[0] > 0
        assert all(g == g and g > 0 for g in r.grad_norms)  # finite, non-zero bucket norms
    # The grad norm is all-reduced over the model-parallel group: one value on every rank.
    assert len({r.optimizer_grad_norm[0] for r in run.ranks}) == 1
    last = [r for r in run.ranks if r.holds_output_layer]
    assert {"loss", "pg_loss", "kl_loss", "tis"} <= set(last[0].losses[0])
    assert all(r.losses == [{}] for r in run.ranks if not r.holds_output_layer)
    # Saved parameters are the ones the checksum covers.
    params = torch.load(run.ranks[0].params_path)
    assert checksum(params) == run.ranks[0].param_checksum


@pytest.mark.slow  # conftest's launch: the fast tier runs the harness through repro's default matrix
@pytest.mark.timeout(300)
def test_a_run_sharing_a_log_prob_pass_ends_where_the_run_that_made_it_does(launched):
    made, shared = launched.runs[0], launched.runs[2]
    assert shared.observed == "completed"
    for a, b in zip(made.ranks, shared.ranks, strict=True):
        assert (b.param_checksum, b.optimizer_grad_norm, b.grad_norms, b.losses, b.site_log_probs) == (
            a.param_checksum,
            a.optimizer_grad_norm,
            a.grad_norms,
            a.losses,
            a.site_log_probs,
        )
        # Same seed, batch and model: the gradients entering the optimizer are equal entry by entry.
        assert b.grad_diff == 0.0
    # The hazard's run never reached the comparison (megatron's check raised first).
    assert [r.grad_diff for r in launched.runs[1].ranks] == [None] * 4


@pytest.mark.slow  # conftest's launch: the fast tier runs the harness through repro's default matrix
@pytest.mark.timeout(300)
def test_hazard_fails_megatrons_nan_check_verbatim_on_every_rank(launched):
    run = launched.runs[1]
    assert run.observed == "nan-check"
    node = os.uname()[1]
    for r in run.ranks:
        assert not r.ok
        assert r.error == f"Rank {r.rank}, node {node}, device cpu, iteration -1: " + (
            "Unexpected result nan (message='found NaN in local grad norm for bucket #0 in backward pass "
            "before data-parallel communication collective')"
        )
        assert r.error.endswith(case.nan_check_message())
        # The case's traceback below slime, line for line (megatron-core 0.15.0rc0).
        assert r.frames == [
            ("schedules.py", 2185, "forward_backward_pipelining_without_interleaving"),
            ("finalize_model_grads.py", 422, "finalize_model_grads"),
            ("distributed_data_parallel.py", 588, "finish_grad_sync"),
            ("param_and_grad_buffer.py", 455, "finish_grad_sync"),
            ("param_and_grad_buffer.py", 333, "start_grad_sync"),
            ("param_and_grad_buffer.py", 185, "check_grads"),
            ("rerun_state_machine.py", 505, "validate_result"),
        ]
        assert list(case.frames()) == r.frames
        assert r.grad_norms[0] != r.grad_norms[0]  # bucket #0's norm is NaN
        assert r.optimizer_grad_norm == [] and r.params_finite  # the step never ran
    # 1F1B: the last stage finishes its backward first, so it raises first (rank 50 in the case).
    assert run.first_failure().holds_output_layer
    # The trigger comes from the model, not the loss: at the planted tool token the model's own
    # log-prob (T 0.8) is below -90.72 and the reference's exceeds it by more than 88.72 nats, so
    # low_var_kl's exp(ref - logp) overflows fp32.
    site = run.ranks[0].site_log_probs[0]
    assert site["policy"] < -(88.72 + 2) and site["ref"] - site["policy"] > 88.72
    assert all(r.site_log_probs == run.ranks[0].site_log_probs for r in run.ranks)  # one batch everywhere


@pytest.mark.slow  # conftest's launch: the fast tier runs the harness through repro's default matrix
@pytest.mark.timeout(300)
def test_runs_are_independent(launched):
    # The failed run rebuilt the model from the same seed and never stepped: its parameters are the
    # initial ones, so they differ from the healthy run's (which took one step).
    healthy, hazard = launched.runs[:2]
    assert all(a.param_checksum != b.param_checksum for a, b in zip(healthy.ranks, hazard.ranks))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hung_rank_is_ended_and_reported(tmp_path):
    # Rank 1 hangs at the start of the run. Whichever watchdog fires first (rank 1's, or a peer's
    # stuck in a collective with it) ends its process after rank_timeout_s; the peers' collectives
    # then fail, torchrun stops the rest, and the parent reports who was stuck and who is missing,
    # well before its own hard timeout.
    res = launcher.launch(
        [RunSpec("healthy", fault="hang:1")],
        timeout_s=250,
        rank_timeout_s=12,  # ~6x what a phase of this run takes on 2 cores
        out_dir=tmp_path,
        loss_flags=case.loss_flags(),
    )
    assert not res.timed_out and res.returncode != 0
    assert res.stuck, res.stderr_tail
    for rank, message in res.stuck.items():
        assert message.startswith(f"rank {rank}: watchdog: stuck in run 0") and message.endswith("; exiting")
    assert 1 in res.runs[0].missing
    assert res.runs[0].observed == "incomplete"


@pytest.mark.timeout(60)
def test_parent_timeout_kills_the_process_tree(tmp_path):
    # 4 ranks cannot import megatron-core in 3 s: the parent kills torchrun's whole session.
    res = launcher.launch([RunSpec("healthy")], timeout_s=3, out_dir=tmp_path, loss_flags=case.loss_flags())
    assert res.timed_out and not res.ok
    assert res.wall_s < 10
    assert res.runs[0].missing == [0, 1, 2, 3] and res.runs[0].observed == "incomplete"
    assert res.returncode == -9  # SIGKILL


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_data_parallel_replica_without_the_nan_blocks_and_the_next_run_is_relaunched(tmp_path):
    # TP2 x DP2 x EP2 (etp 1), PP1: the hazard's NaN sample lands on replica 0 (sample i -> i % dp),
    # so only ranks 0 and 1 fail the NaN check; replica 1's grads are finite, it passes the check and
    # blocks in the data-parallel all-reduce its peers never join, until its watchdog ends it. The
    # run after it is executed by a fresh launch.
    layout = Layout(tp=2, pp=1, dp=2, ep=2, etp=1)
    runs = [RunSpec("nan-rollout-logprob"), RunSpec("healthy")]
    res = launcher.launch(
        runs, layout, timeout_s=380, rank_timeout_s=45, out_dir=tmp_path, loss_flags=case.loss_flags()
    )
    hazard, healthy = res.runs
    assert [(r.rank, r.dp, r.ok) for r in hazard.ranks] == [(0, 0, False), (1, 0, False)]
    assert all(r.error.endswith(case.nan_check_message()) for r in hazard.ranks)
    assert hazard.missing == [2, 3] and hazard.observed == "incomplete"
    assert any("train_one_step" in m for m in res.stuck.values())
    assert res.launches == 2 and healthy.observed == "completed"
