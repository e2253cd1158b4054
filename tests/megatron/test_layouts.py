"""The plugin over the layouts real runs use, through real megatron-core on CPU (gloo), a NaN planted on one replica
or in one chunk (layout_worker.py): DP 2 with the distributed optimizer; --overlap-grad-reduce with megatron's
check on and off; full activation recompute; PP 2 with 2 virtual stages (interleaved 1F1B). Modes: raise, skip
and skip-on-transient, with the rerun on and off (skip-on-transient without the rerun is refused at install:
tests/slime_plugin/test_hook.py). In every combination:

    the step ends within a bound            the launch returns, no rank's watchdog fired
    every raising rank carries Megatron's   its error's last line is megatron's own, of the rank that saw the NaN
    the report and the bundle exist         on the rank that saw it
    skip mode skips on every rank           grad norm NaN, one skipped step, the LR schedule not advanced
    the next healthy step is bitwise equal  to a run that trained that step alone (the skipped one never ran)

And a report that cannot be written (a disk that takes no file past 4 KiB, on the rank that saw the value) in skip
mode: the step is skipped on every rank all the same (before: that rank raised torch.save's RuntimeError alone
and its peer waited in the data-parallel collective).
"""

import json
from pathlib import Path

import pytest

from tests.megatron.layout_checks import (
    DP2_LAYOUTS,
    RAISE,
    SKIP,
    check_dp2,
    check_skip,
    check_vpp,
    launch,
    megatron_rank,
    report_of,
)

WORKER = Path(__file__).with_name("layout_worker.py")

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("dp2"), WORKER, "--group", "dp2")


@pytest.fixture(scope="module")
def vpp(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("vpp"), WORKER, "--group", "pp2-vpp2")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", DP2_LAYOUTS)
@pytest.mark.parametrize("mode", RAISE + SKIP)
def test_dp2_layouts(dp2, layout, mode):
    check_dp2(dp2, layout, mode)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", RAISE + SKIP)
def test_pipeline_with_two_virtual_stages(vpp, mode):
    check_vpp(vpp, mode)
    report = report_of(vpp[0]["pp2-vpp2"][mode])
    # chunk 1 of stage 0 holds layer 2: its global name, not chunk 1's local layer 0
    assert report["first_forward"]["module"] == "decoder.layers.2.mlp" and report["first_forward"]["microbatch"] == 0


@pytest.mark.timeout(600)
def test_a_report_that_cannot_be_written_still_skips_on_every_rank(dp2):
    check_skip(dp2, "dp2", "skip-full-disk")
    (report,) = dp2[1]["dp2"]["skip-full-disk"]["reports"]  # the bundle did not fit; the report did
    assert Path(report).name == "rollout0_step0_rank1.json" and json.loads(Path(report).read_text())["bundle"] is None


@pytest.mark.timeout(600)
def test_the_report_and_bundle_are_written_before_the_rerun_runs_out_of_memory(dp2):
    for rank in dp2:
        (step,) = rank["dp2"]["rerun-oom"]["steps"]
        assert step["error_type"] == "OutOfMemoryError"  # the rerun's, on every rank: the user's error, unchanged
    run = dp2[1]["dp2"]["rerun-oom"]
    assert sorted(Path(p).name for p in run["reports"]) == [
        "rollout0_step0_rank1.bundle.pt",
        "rollout0_step0_rank1.json",
    ]
    report = report_of(run)
    assert "rerun" not in report and report["first_forward"]["module"] == "decoder.layers.1.mlp"


@pytest.mark.timeout(600)
def test_a_zero_token_expert_is_not_ruled_out_by_a_clean_rerun_and_not_skipped_as_transient(dp2):
    report = report_of(dp2[1]["dp2"]["zero-token"])
    finding = report["expert_tokens"]["finding"]
    assert finding.startswith("expert 5 of layer 3 received 0 tokens, and its weight gradient is the first non-finite")
    rerun = report["rerun"]
    assert rerun["verdict"] == "not reproducible" and rerun["rerun"] is None  # the rerun was finite
    assert rerun["not_ruled_out"] == [f"a zero-token expert: {finding} (rank 1)"]
    for r, rank in enumerate(dp2):  # NANSCOPE_SKIP_ON=transient does not skip it: every rank raises
        run = rank["dp2"]["zero-token"]
        (step,) = run["steps"]
        assert run["skipped"] == 0 and megatron_rank(step["error"]) == 1
        head = step["error"].splitlines()[0]
        if r == 1:
            assert head.startswith("nanscope: rerun: not reproducible, but not only a transient fault: ")
            assert "NANSCOPE_SKIP_ON=transient does not skip this step" in head
        else:
            assert step["error_type"] == "PeerNonFinite" and "rerun: not reproducible" in head


@pytest.mark.timeout(600)
@pytest.mark.parametrize("group", ["dp2", "vpp"])
def test_the_plugins_loss_counts_reach_the_logging_rank_once_a_step(request, group):
    # the plugin's loss over a NaN rollout log-prob on a masked token and a NaN old log-prob on a trained one
    # (different samples, so over DP 2 on different replicas): both steps finite, the counts summed over the replicas
    # (or taken from the last pipeline stage) and logged once a step by the one logging rank
    layout = "dp2" if group == "dp2" else "pp2-vpp2"
    runs = [rank[layout]["plugin-loss"] for rank in request.getfixturevalue(group)]
    for run in runs:
        assert [("error" in s, s.get("grad_norm", 0) == s.get("grad_norm", 1)) for s in run["steps"]] == [
            (False, True)
        ] * 2
    (logged,) = [run["logged"] for run in runs if run["logged"]]
    zero = {f"nanscope/nan_guard/{k}": 0.0 for k in
            ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "exp_overflow", "dropped_tokens")}  # fmt: skip
    dropped = {"nanscope/nan_guard/log_probs": 1.0, "nanscope/nan_guard/rollout_log_probs": 1.0,
               "nanscope/nan_guard/dropped_tokens": 1.0}  # fmt: skip
    assert [{k: step[k] for k in zero} for step in logged] == [{**zero, **dropped}, zero]
    lines = [line for run in runs for line in run["stdout"] if "nan_guard" in line]
    assert lines == [f"nanscope: rollout 0 step 0: {dropped}"]
