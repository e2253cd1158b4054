"""The plugin's before-train-step hook: its settings, and its life on real megatron-core chunks (one process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanscope import case
from nanscope.loss import guard
from nanscope.slime_plugin.outputs import replay_instruction
from nanscope.slime_plugin.settings import Settings

WORKER = Path(__file__).parents[1] / "workers" / "hook_worker.py"
HEADROOM = (
    "nanscope/max_kl_log_ratio",
    "nanscope/max_ppo_log_ratio",
    "nanscope/max_tis_log_ratio",
    "nanscope/train_rollout_gap_mean",
    "nanscope/train_rollout_gap_p99",
    "nanscope/train_rollout_gap_max",
    "nanscope/clamped_tokens",
    "nanscope/nonfinite_inputs",
) + tuple(f"nanscope/{name}" for name in guard.METRICS)  # None here: slime's own loss, not the plugin's


def test_settings_from_the_environment():
    assert Settings.from_env({}) == Settings("nanscope_reports", "raise", None, None)
    env = {
        "NANSCOPE_REPORT_DIR": "/r",
        "NANSCOPE_ON_NONFINITE": "skip",
        "NANSCOPE_MAX_SKIPS": "3",
        "NANSCOPE_TRACE_STEP": "12:0",
    }
    assert Settings.from_env(env) == Settings("/r", "skip", 3, (12, 0))
    assert Settings.from_env({k: "" for k in env}) == Settings()  # empty is unset


@pytest.mark.parametrize(
    "env,message",
    [
        ({"NANSCOPE_ON_NONFINITE": "ignore"}, "NANSCOPE_ON_NONFINITE='ignore': expected one of raise, skip"),
        (
            {"NANSCOPE_ON_NONFINITE": "skip", "NANSCOPE_MAX_SKIPS": "0"},
            "NANSCOPE_MAX_SKIPS='0': expected an integer >= 1",
        ),
        (
            {"NANSCOPE_ON_NONFINITE": "skip", "NANSCOPE_MAX_SKIPS": "-1"},
            "NANSCOPE_MAX_SKIPS='-1': expected an integer >= 1",
        ),
        ({"NANSCOPE_TRACE_STEP": "12"}, "NANSCOPE_TRACE_STEP='12': expected ROLLOUT:STEP, e.g. 12:0"),
        ({"NANSCOPE_TRACE_STEP": "a:1"}, "NANSCOPE_TRACE_STEP='a:1': expected ROLLOUT:STEP, e.g. 12:0"),
        # int() takes other scripts' digits and any length; a setting takes ASCII digits, few of them
        ({"NANSCOPE_MAX_SKIPS": "\u0663"}, "NANSCOPE_MAX_SKIPS='\u0663': expected an integer >= 1"),
        ({"NANSCOPE_MAX_SKIPS": "\uff13"}, "NANSCOPE_MAX_SKIPS='\uff13': expected an integer >= 1"),
        ({"NANSCOPE_MAX_SKIPS": "\u00b2"}, "NANSCOPE_MAX_SKIPS='\u00b2': expected an integer >= 1"),
        (
            {"NANSCOPE_MAX_SKIPS": "9" * 5000},
            f"NANSCOPE_MAX_SKIPS={'9' * 40!r}... (5000 characters): expected an integer >= 1",
        ),
        ({"NANSCOPE_TRACE_STEP": "\u0663:0"}, "NANSCOPE_TRACE_STEP='\u0663:0': expected ROLLOUT:STEP, e.g. 12:0"),
        (
            {"NANSCOPE_TRACE_STEP": "1:" + "9" * 5000},
            f"NANSCOPE_TRACE_STEP={'1:' + '9' * 38!r}... (5002 characters): expected ROLLOUT:STEP, e.g. 12:0",
        ),
        ({"NANSCOPE_NAN_POLICY": "lenient"}, "NANSCOPE_NAN_POLICY='lenient': expected one of drop, strict"),
        # skip-on-transient needs the verdict the rerun gives: refused, not silently "any"
        (
            {"NANSCOPE_ON_NONFINITE": "skip", "NANSCOPE_SKIP_ON": "transient", "NANSCOPE_RERUN": "off"},
            "NANSCOPE_SKIP_ON=transient needs the rerun's verdict, and NANSCOPE_RERUN=off turns the rerun off: set "
            "NANSCOPE_RERUN=on, or NANSCOPE_SKIP_ON=any to skip every non-finite step",
        ),
        # equal thresholds make one warning the other's; 0 warns on every token
        (
            {"NANSCOPE_WARN_LOG_RATIO": "0,0"},
            "NANSCOPE_WARN_LOG_RATIO='0,0': expected LOW,HIGH with 0 < LOW < HIGH, like 20,60",
        ),
        (
            {"NANSCOPE_WARN_LOG_RATIO": "30,30"},
            "NANSCOPE_WARN_LOG_RATIO='30,30': expected LOW,HIGH with 0 < LOW < HIGH, like 20,60",
        ),
        (
            {"NANSCOPE_WARN_LOG_RATIO": "60,20"},
            "NANSCOPE_WARN_LOG_RATIO='60,20': expected 2 ascending number(s) like 20,60",
        ),
        ({"NANSCOPE_MAX_BUNDLES": "-1"}, "NANSCOPE_MAX_BUNDLES='-1': expected an integer >= 0"),
    ],
)
def test_bad_settings_are_one_line(env, message):
    with pytest.raises(ValueError) as e:
        Settings.from_env(env)
    assert str(e.value) == message


def test_a_setting_that_is_not_the_plugins_is_named_with_the_closest_real_one():
    env = {
        "NANSCOPE_ONNONFINITE": "skip",
        "NANSCOPE_RERUNS": "off",
        "NANSCOPE_SLIME_SRC": "../shared",
        "NANSCOPE_TEST_TAG": "x",
    }
    settings = Settings.from_env(env)
    assert settings == Settings() and settings.unknown == ("NANSCOPE_ONNONFINITE", "NANSCOPE_RERUNS")
    every = ", ".join(
        f"NANSCOPE_{n}" for n in ("REPORT_DIR", "ON_NONFINITE", "MAX_SKIPS", "TRACE_STEP", "NAN_POLICY", "RERUN",
                                  "SKIP_ON", "MAX_BUNDLES", "WARN_GAP", "WARN_LOG_RATIO")
    )  # fmt: skip
    assert settings.unknown_lines() == [
        f"NANSCOPE_ONNONFINITE is not one of the plugin's variables, so it does nothing; the closest is "
        f"NANSCOPE_ON_NONFINITE (all: {every})",
        f"NANSCOPE_RERUNS is not one of the plugin's variables, so it does nothing; the closest is NANSCOPE_RERUN "
        f"(all: {every})",
    ]
    assert Settings.from_env({"NANSCOPE_MAX_BUNDLES": "0"}).max_bundles == 0


def test_replay_instruction_names_the_step_and_the_saved_rollouts():
    args = case.args()
    args.save_debug_rollout_data = "/root/dumps/rollout_data/{rollout_id}.pt"
    r = replay_instruction(args, 12, 1)
    assert r == {
        "NANSCOPE_TRACE_STEP": "12:1",
        "load_debug_rollout_data": "/root/dumps/rollout_data/{rollout_id}.pt",
        "text": "rerun from the checkpoint before rollout 12 with NANSCOPE_TRACE_STEP=12:1 in the environment "
        "and --load-debug-rollout-data /root/dumps/rollout_data/{rollout_id}.pt",
    }
    assert replay_instruction(case.args(), 0, 0)["text"].endswith(
        "--load-debug-rollout-data <the --save-debug-rollout-data path; this run saved no rollouts>"
    )


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    out = tmp_path_factory.mktemp("hook")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    # in its own directory: an installation before NANSCOPE_REPORT_DIR is set checks ./nanscope_reports there
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out)], env=env, cwd=out, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text()), proc.stdout


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_installing_twice_or_on_new_chunks_leaves_one_set_and_uninstall_restores(worker):
    life = worker[0]["lifecycle"]
    before = life["a_before"]
    assert not (before["finish_grad_sync"] or before["step"] or before["scheduler_step"])
    installed = life["a_once"]
    assert installed["hooks"] > before["hooks"]
    assert installed["finish_grad_sync"] and installed["step"] and installed["scheduler_step"]
    assert life["a_twice"] == installed  # a second call on the same chunks adds nothing
    assert life["a_after_b"] == before  # new chunks: the old ones are restored, every hook removed
    assert life["b_installed"] == installed  # the same model built again: exactly one set
    assert life["b_after_uninstall"] == before


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_skip_reports_a_nan_grad_norm_logs_skipped_steps_and_leaves_the_parameters_of_a_run_without_that_step(worker):
    result, stdout = worker
    skip = result["skip"]
    norms = skip["grad_norms"]
    assert norms[0] > 0 and norms[1] != norms[1] and norms[2] > 0  # the skipped step's grad norm is NaN
    assert skip["skipped"] == 1 and skip["error"] is None
    assert skip["lr_steps"] == result["without_bad_step"]["lr_steps"] == 2 * 8  # the LR schedule skipped it too
    logged = [{"rollout_id": i, "step_id": 0, "nanscope/skipped_steps": n} for i, n in enumerate([0, 1, 1])]
    assert [{k: step[k] for k in logged[0]} for step in skip["logged"]] == logged
    assert all(set(step) == set(logged[0]) | set(HEADROOM) | {"warnings"} for step in skip["logged"])
    assert "nanscope: rollout 1 step 0: {'nanscope/skipped_steps': 1}\n" in stdout
    assert stdout.count("nanscope: warning: NANSCOPE_ONNONFINITE is not one of the plugin's variables, so it does "
                        "nothing; the closest is NANSCOPE_ON_NONFINITE (all: ") == 1  # fmt: skip
    # The NaN never reaches the parameters: bitwise those of a run that never trained on the bad rollout.
    assert result["params_finite"] and result["params_equal"]
    assert result["without_bad_step"]["grad_norms"] == [norms[0], norms[2]]


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_max_skips_ends_the_run_after_k_skips_in_a_row(worker):
    m = worker[0]["max_skips"]
    # [bad, healthy, bad, bad]: the healthy step resets the count; the second bad in a row stops the run.
    nan, healthy, nan_again = m["grad_norms"]  # the fourth step raised before its optimizer step
    assert nan != nan and healthy > 0 and nan_again != nan_again
    assert m["skipped"] == 3
    assert m["error"].startswith(
        "nanscope: 2 step(s) in a row had non-finite gradients (the last: rollout 3 step 0); "
        "NANSCOPE_MAX_SKIPS=2: stopping the run. Reports: "
    )


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_trace_step_names_the_op_module_line_sample_and_token(worker):
    result, stdout = worker
    t = result["trace"]
    assert t["error"].endswith(case.nan_check_message())  # raise mode: megatron's check still ends the step
    sample, token = t["site"]
    (trace_path,) = [p for p in t["reports"] if p.endswith(".trace.json")]
    (bundle_path,) = [p for p in t["reports"] if p.endswith(".bundle.pt")]
    (report_path,) = [p for p in t["reports"] if p not in (trace_path, bundle_path)]
    assert bundle_path == report_path.removesuffix(".json") + ".bundle.pt" and len(t["reports"]) == 3
    report, trace = result["files"][report_path], result["files"][trace_path]
    assert report["bundle"] == report["microbatch_file"] == bundle_path
    assert (report["rollout_id"], report["step_id"], report["replay"]["NANSCOPE_TRACE_STEP"]) == (1, 0, "1:0")
    fwd, bwd = trace["first"]["forward"], trace["first"]["backward"]
    assert (fwd["op"], fwd["sample"], fwd["token"], fwd["masked"], fwd["microbatch"]) == (
        "aten.exp.default",
        sample,
        token,
        True,
        sample,
    )  # one sample per micro-batch
    assert " in approx_kl `k3 = (-log_ratio).exp() - 1 + log_ratio`" in fwd["source"]
    assert (bwd["op"], bwd["node"], bwd["sample"], bwd["token"]) == ("aten.mul.Tensor", "ExpBackward0", sample, token)
    assert trace["microbatch_samples"] == {str(i): [i] for i in range(len(case.rollout(512, 2).total_lengths))}
    assert (
        "nanscope trace of rollout 1 step 0 (all ranks):\n  forward: rank 0 (pp 0, tp 0): aten.exp.default produced inf"
    ) in stdout


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_report_that_cannot_be_written_is_a_warning_and_the_run_goes_on_as_without_it(worker):
    result, stdout = worker
    skip, raised = result["unwritable_skip"], result["unwritable_raise"]
    # skip mode: the step is still skipped and the run goes on; raise mode: megatron's own error, unchanged
    assert skip["skipped"] == 1 and skip["error"] is None
    assert [p.rsplit("/", 1)[1] for p in skip["reports"]] == ["rollout1_step0_rank0.bundle.pt"]  # the bundle is kept
    assert skip["grad_norms"][1] != skip["grad_norms"][1] and skip["grad_norms"][2] > 0
    head, megatron = raised["error"].splitlines()
    assert head == "nanscope: rank 0: non-finite values at rollout 1 step 0 (no report written: see the warning)"
    assert megatron == result["trace"]["error"].splitlines()[1] and raised["error"].endswith(case.nan_check_message())
    assert [p.rsplit("/", 1)[1] for p in raised["reports"]] == ["rollout1_step0_rank0.bundle.pt"]
    warning = "nanscope: warning: rank 0: could not write its report rollout1_step0_rank0.json to "
    assert stdout.count(warning) == 2 and f"{warning}{result['blocked']}: Is a directory\n" in stdout
    assert "rollout 1 step 0: no report written; to name the op offline: nanscope trace " in stdout
