"""`nanscope repro`: input errors and exit codes without a launch, then one real 4-process run."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from nanscope import case, repro
from nanscope.causes import catalogue
from nanscope.cli.main import main
from nanscope.megatron.spec import RankRecord
from nanscope.report import repro as report


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """repro's lines read whole at 160 columns, its width before issue 42 (the rule: tests/cli/test_terminal.py)."""
    monkeypatch.setenv("COLUMNS", "160")


def test_unknown_hazard_is_one_line_user_error(capsys):
    assert main(["repro", "--hazard", "nope"]) == 2
    err = capsys.readouterr().err
    # every catalogue entry, in the catalogue's order (its first nine are the ones below)
    known = ", ".join(h.name for h in catalogue.CATALOGUE)
    assert known.startswith(
        "healthy, kl-exp-overflow, ratio-exp-overflow, nan-rollout-logprob, nan-reward, zero-temperature, "
        "rollout-logprob-shift, activation-overflow, backward-only-fault, "
    )
    assert err == f"nanscope repro: error: --hazard: unknown hazard 'nope'; known: {known}\n"


def test_expected_outcome_follows_the_catalogue():
    # The as-is loss fails the check exactly where the catalogue's gradient is not finite.
    assert repro.expected_outcome("healthy", "as-is") == "completed"
    for name in ("kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward"):
        assert repro.expected_outcome(name, "as-is") == "nan-check"
        assert repro.expected_outcome(name, "safe") == "completed"
    # the fix lives in a flag or the model: the safe loss fails the check too; a shift leaves it finite
    for name in ("zero-temperature", "activation-overflow", "backward-only-fault", "transient-fault", "moe-aux-loss",
                 "moe-zero-token-expert", "moe-router-logits"):  # fmt: skip
        assert (repro.expected_outcome(name, "as-is"), repro.expected_outcome(name, "safe")) == ("nan-check",) * 2
    assert repro.expected_outcome("rollout-logprob-shift", "as-is") == "completed"
    assert repro.expected_outcome("healthy", "safe", fault="decoder.layers.0.mlp:forward:inf") == "nan-check"


def _rank(rank, pp, ok):
    err = None if ok else f"Rank {rank}, node n, device cpu, iteration -1: {case.nan_check_message()}"
    return RankRecord(rank=rank, pp=pp, tp=rank % 2, dp=0, ep=0, layers=[2 * pp, 2 * pp + 1],
                      holds_output_layer=pp == 1, ok=ok, error=err, error_time=None if ok else 10.0 - rank,
                      optimizer_grad_norm=[1.5] if ok else [])  # fmt: skip


def test_verdict_and_exit_code_compare_observed_with_expected():
    failed = repro.Repro("kl-exp-overflow", "as-is", "nan-check", "nan-check", {}, [_rank(r, r // 2, False) for r in range(4)],
                         first_failure=3, frames_match_case=True)  # fmt: skip
    assert failed.ok
    assert report.verdict(failed) == (
        "as expected: kl-exp-overflow under the as-is loss fails megatron-core's DDP NaN check: "
        "NaN check on 4/4 ranks, rank 3 raised first (last stage); frames match the case's traceback"
    )
    done = repro.Repro(
        "kl-exp-overflow", "as-is", "nan-check", "completed", {}, [_rank(r, r // 2, True) for r in range(4)]
    )
    assert not done.ok
    assert report.verdict(done) == (
        "UNEXPECTED (expected nan-check): kl-exp-overflow under the as-is loss: the step completed on all 4 ranks (grad norm [1.5])"
    )


@pytest.mark.slow  # the fast tier runs --hazard through --trace, below
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_repro_hazard_reproduces_the_case_and_writes_json(tmp_path, capsys, monkeypatch):
    path, tmp = tmp_path / "r.json", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # this process's temp dirs and torchrun's
    assert main(["repro", "--hazard", "nan-reward", "--loss", "as-is", "--json", str(path), "--timeout", "350"]) == 0
    assert list(tmp.iterdir()) == []  # no nanscope-* nor torchelastic_* left behind
    out = capsys.readouterr().out
    assert "fails megatron-core's DDP NaN check: NaN check on 4/4 ranks" in out
    assert "param_and_grad_buffer.py:185 in check_grads" in out
    doc = json.loads(path.read_text())
    assert (doc["expected"], doc["observed"], doc["ok"]) == ("nan-check", "nan-check", True)
    assert doc["frames_match_case"] is True
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    for r in doc["ranks"]:
        assert {"rank", "pp", "tp", "ok", "error", "grad_norms", "frames"} <= set(r)
        assert r["ok"] is False and r["error"].startswith(f"Rank {r['rank']}, node ")
        assert r["error"].endswith(case.nan_check_message())
    first = next(r for r in doc["ranks"] if r["rank"] == doc["first_failure"])
    assert first["pp"] == 1  # the last pipeline stage raises first, as rank 50 in the case


# the sentinel in each as-is run of the matrix: (rank that saw it first, class, module, direction)
MATRIX_SENTINEL = {
    "healthy": (None, None, None, None),
    "kl-exp-overflow": (2, "loss-numerics", "output_layer", "backward"),
    "ratio-exp-overflow": (2, "loss-numerics", "output_layer", "backward"),
    "nan-rollout-logprob": (2, "data", None, None), "nan-reward": (2, "data", None, None),
    "zero-temperature": (2, "data", None, None), "rollout-logprob-shift": (None, None, None, None),
    "activation-overflow": (0, "model-forward", "decoder.layers.1.mlp", "forward"),  # the planted module
    "backward-only-fault": (0, "model-backward", "decoder.layers.0.self_attention", "backward"),  # planted
    "transient-fault": (0, "model-forward", "decoder.layers.1.mlp", "forward"),  # one call: the matrix is one step
    "logprob-drift": (2, "loss-numerics", "output_layer", "backward"),  # a one-step matrix: already crossed
    "moe-aux-loss": (2, "model-backward", "decoder.layers.2.mlp.router", "backward"),
    "moe-zero-token-expert": (2, "model-backward", "decoder.layers.3.mlp.experts.local_experts.5.linear_fc2",
                              "backward"),  # the empty expert's weight gradient
    "moe-router-logits": (0, "model-forward", "decoder.layers.1.mlp.router", "forward"),
}  # fmt: skip


def _check_matrix(code: int, doc: dict, out: str, names: list[str]) -> None:
    """A matrix run of `names` (exit code, JSON, output): each row as expected (the sentinel, the outcomes, the
    frames)."""
    assert code == 0
    assert doc["ok"] is True
    rows = {r["hazard"]: r for r in doc["matrix"]}
    assert list(rows) == names
    assert {name: tuple(row["as_is"]["sentinel"][k] for k in ("rank", "class", "module", "direction"))
            for name, row in rows.items()} == {name: MATRIX_SENTINEL[name] for name in names}  # fmt: skip
    if "backward-only-fault" in rows:
        assert rows["backward-only-fault"]["as_is"]["fault"] == "decoder.layers.0.self_attention:backward:nan"
        # stage 0 fails the check; stage 1's gradients pass it and its ranks stop instead of hanging
        outcomes = [
            (r["rank"], r["ok"], r["error"].endswith(case.nan_check_message()))
            for r in rows["backward-only-fault"]["as_is"]["ranks"]
        ]
        assert outcomes == [(0, False, True), (1, False, True), (2, False, False), (3, False, False)]
    for name, row in rows.items():
        assert row["safe_params_finite"] is True, name
        fixed_elsewhere = {"zero-temperature", "activation-overflow", "backward-only-fault", "transient-fault"}
        if name in fixed_elsewhere or name.startswith("moe-"):  # in the flags, the model, the kernel or the GPU
            assert (row["as_is"]["observed"], row["safe"]["observed"]) == ("nan-check", "nan-check"), name
        elif name in ("healthy", "rollout-logprob-shift"):
            assert (row["as_is"]["observed"], row["safe"]["observed"]) == ("completed", "completed"), name
        else:
            assert row["safe"]["observed"] == "completed", name
        if name == "healthy":
            assert row["max_grad_diff_safe_vs_as_is"] == 0.0  # the fix leaves a healthy gradient bit for bit
        elif name != "rollout-logprob-shift":
            a = row["as_is"]
            assert a["observed"] == "nan-check" and a["frames_match_case"] is True, name
            first = next(r for r in a["ranks"] if r["rank"] == a["first_failure"])
            # a last-stage rank raises first, unless the NaN starts in stage 0's backward
            assert first["holds_output_layer"] is (name != "backward-only-fault"), name
            assert first["error"].startswith(f"Rank {first['rank']}, node ")
            assert first["error"].endswith(f", device cpu, iteration -1: {case.nan_check_message()}")
    text = " ".join(out.split())  # wrapped at the console's width
    assert f"nanscope repro: case slime-795 scaled down, {len(names)} hazards x {{as-is, safe}}" in text
    assert "as expected: slime v0.1.0's loss fails megatron-core's NaN check" in text


@pytest.mark.integration
@pytest.mark.timeout(500)
def test_repro_without_arguments_runs_the_case_s_matrix(tmp_path, capsys, monkeypatch):
    path = tmp_path / "m.json"
    monkeypatch.setenv("COLUMNS", "80")  # issue 42 item 2: a newcomer's 80-column terminal
    code = main(["repro", "--json", str(path)])
    out, err = capsys.readouterr()
    assert max(map(len, out.splitlines())) <= 80
    for hazard in catalogue.CASE_HAZARDS:  # whole: the seven columns cut them mid-word at 80 ("kl-exp-o" / "verflow")
        assert f"hazard {hazard.name}" in out.splitlines(), hazard.name
    _check_matrix(code, json.loads(path.read_text()), out, [h.name for h in catalogue.CASE_HAZARDS])
    # issue 42 item 3: one line a run on stderr as it ends (the launch's progress), then where --json wrote
    runs = [(h.name, loss) for h in catalogue.CASE_HAZARDS for loss in ("as-is", "safe")]
    assert (
        err
        == "".join(
            f"nanscope repro: run {i} of 10 done: {hazard}, {loss}\n" for i, (hazard, loss) in enumerate(runs, 1)
        )
        + f"nanscope repro: wrote {path} (--json)\n"
    )
    assert [h.name for h in catalogue.CASE_HAZARDS] == [
        "healthy", "kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward"
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_repro_all_runs_the_whole_catalogue(all_matrix):
    _check_matrix(*all_matrix, list(MATRIX_SENTINEL))
    assert list(MATRIX_SENTINEL) == [h.name for h in catalogue.CATALOGUE]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(500)
def test_repro_several_steps(tmp_path):
    path = tmp_path / "s.json"
    assert (
        main(["repro", "--hazard", "kl-exp-overflow", "--steps", "3", "--inject-step", "2", "--json", str(path)]) == 0
    )
    doc = json.loads(path.read_text())
    assert (doc["ok"], doc["as_is_died_at"], doc["safe_steps_completed"]) == (True, 2, 3)
    assert doc["max_param_diff_safe_vs_defused_twin"] == 0.0  # bitwise
    assert all(r["params_finite"] for r in doc["safe"]["ranks"])


def test_a_comparison_over_no_ranks_is_null_and_says_nothing_was_compared():
    """Issue 32 item 8: with --timeout 1 no rank saved its parameters, and safe's were said to equal the defused
    twin's "bitwise" (max_param_diff 0.0)."""
    assert repro.max_abs_diff([], []) is None
    assert repro.max_abs_diff(["a.pt"], []) is None
    timed_out = [repro.Repro("kl-exp-overflow", loss, expected, "timeout", {}) for loss, expected in
                 (("as-is", "nan-check"), ("safe", "completed"), ("as-is", "completed"))]  # fmt: skip
    check = repro.StepsCheck("kl-exp-overflow", 2, 1, *timed_out, param_diff=None, wall_s=1.0, notes=[])
    doc = report.steps_to_json(check)
    assert doc["max_param_diff_safe_vs_defused_twin"] is None and doc["ok"] is False
    assert doc["verdict"] == (
        "UNEXPECTED: kl-exp-overflow at step 1 of 2: as-is timeout; safe completes 0/2 steps, no rank reported its "
        "parameters; safe's parameters after step 2 were not compared with those of as-is on the hazard's defused "
        "twin: a run saved none (nothing was compared)"
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_launch_that_timed_out_claims_no_equality(tmp_path, capsys):
    path = tmp_path / "s.json"
    argv = ["repro", "--hazard", "kl-exp-overflow", "--steps", "2", "--timeout", "1", "--json", str(path)]
    assert main(argv) == 1
    doc = json.loads(path.read_text())
    assert doc["max_param_diff_safe_vs_defused_twin"] is None
    assert "bitwise" not in capsys.readouterr().out and "(nothing was compared)" in doc["verdict"]


def test_steps_needs_a_hazard_and_a_step_inside(capsys):
    assert main(["repro", "--hazard", "healthy", "--steps", "5"]) == 2
    assert main(["repro", "--steps", "5", "--inject-step", "7"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "nanscope repro: error: --steps needs a hazard to inject (--hazard NAME, not healthy)",
        "nanscope repro: error: --inject-step 7 is outside steps 1..5",
    ]


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_repro_trace_names_the_exp_backward_in_the_kl_term_and_the_masked_token(tmp_path):
    path = tmp_path / "t.json"
    assert main(["repro", "--hazard", "kl-exp-overflow", "--loss", "as-is", "--trace", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    fwd, bwd = doc["trace"]["forward"], doc["trace"]["backward"]
    sample, token = doc["hazard_site"]
    assert (fwd["op"], fwd["produced"], fwd["masked"]) == ("aten.exp.default", "inf", True)
    assert (bwd["node"], bwd["produced"], bwd["masked"]) == ("ExpBackward0", "nan", True)
    for e in (fwd, bwd):
        assert "in approx_kl" in e["source"] and "formulas.py" in e["source"]
        assert (e["microbatch"], e["token"]) == (sample, token)  # one sample per micro-batch


def test_trace_needs_one_hazard(capsys):
    assert main(["repro", "--trace"]) == 2
    assert (
        capsys.readouterr().err == "nanscope repro: error: --trace goes with --hazard NAME (one step of one hazard)\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hazard", "nan-reward", "--inject-step", "2"], "--inject-step 2 goes with --steps N"),
        (["--ray-timeout", "5"], "--ray-timeout 5 goes with --ray-address (joining a cluster)"),
    ],
)
def test_what_goes_together_is_one_line_before_any_launch(argv, message, capsys):
    assert main(["repro", *argv]) == 2
    assert capsys.readouterr().err == f"nanscope repro: error: {message}\n"


SECONDS = "expected a number of seconds > 0 and <= 604800"
STEPS = "expected an integer from 1 to 100"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--timeout", "nan"], f"argument --timeout: 'nan': {SECONDS}"),
        (["--timeout", "0"], f"argument --timeout: '0': {SECONDS}"),
        (["--timeout", "-5"], f"argument --timeout: '-5': {SECONDS}"),
        (["--timeout", "inf"], f"argument --timeout: 'inf': {SECONDS}"),
        (["--steps", "0"], f"argument --steps: '0': {STEPS}"),
        (["--steps", "-1", "--inject-step", "1"], f"argument --steps: '-1': {STEPS}"),
        # issue 32: upper bounds, stated in --help
        (["--steps", "101"], f"argument --steps: '101': {STEPS}"),
        (["--fault", "output_layer:forward:nan", "--fault-step", "10000000"], f"argument --fault-step: '10000000': {STEPS}"),
        (["--launcher", "ray", "--ray-address", "h:1", "--ray-timeout", "nan"], f"argument --ray-timeout: 'nan': {SECONDS}"),
    ],
)  # fmt: skip
def test_bad_numbers_are_one_line_errors_before_any_launch(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's error (nanscope.cli.numbers' types)
        main(["repro", *argv])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"nanscope repro: error: {message}")


def test_help_states_the_upper_bounds_of_steps(capsys):
    with pytest.raises(SystemExit):
        main(["repro", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "run N optimizer steps with the hazard at --inject-step (1..100)" in text
    assert "with --fault: the step it fires at, 1..100 (default 1;" in text


def _ours(tag: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of every live (not zombie) process whose environment carries NANSCOPE_TEST_TAG=tag."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = open(f"/proc/{entry}/environ", "rb").read()
            state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"NANSCOPE_TEST_TAG={tag}".encode() in environ.split(b"\0") and state != "Z":
            found.append((int(entry), cmdline))
    return found


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
def test_a_stop_signal_kills_every_worker_and_removes_the_temp_dirs(tmp_path, sig, code):
    tag, tmp = uuid.uuid4().hex, tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "NANSCOPE_TEST_TAG": tag, "TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "nanscope.cli.main", "repro", "--hazard", "kl-exp-overflow", "--steps", "12",
            "--inject-step", "11"]  # fmt: skip
    # As from a terminal: the signal at its default even when pytest runs in a background job or under nohup.
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while sum("nanscope.megatron.worker" in c and "torch.distributed.run" not in c for _, c in _ours(tag)) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, "the 4 workers never started"
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code
    assert err.decode() == "nanscope repro: interrupted; 4 workers stopped\n"
    assert _ours(tag) == []
    assert sorted(p.name for p in tmp.iterdir()) == []  # no torchelastic_*, nanscope-* left


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_sigkill_of_repro_leaves_no_worker_and_no_temp_dir(tmp_path):
    # SIGKILL cannot be caught: the agent notices its parent's death, kills the ranks and removes the
    # launch's temp dirs (nanscope-run-*, nanscope-tmp-* with torchrun's torchelastic_* inside).
    tag, tmp = uuid.uuid4().hex, tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "NANSCOPE_TEST_TAG": tag, "TMPDIR": str(tmp)}
    # Healthy steps up to a fault at step 100: the launch is still running when the parent is killed.
    argv = [sys.executable, "-m", "nanscope.cli.main", "repro", "--fault", "decoder.layers.0.mlp:forward:nan",
            "--fault-step", "100"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while sum("nanscope.megatron.worker" in c for _, c in _ours(tag)) < 5:  # the agent and its 4 ranks
            assert proc.poll() is None and time.monotonic() < deadline, "the 4 ranks never started"
            time.sleep(0.1)
        assert sorted(p.name.split("-")[1] for p in tmp.iterdir()) == ["run", "tmp"]
        proc.kill()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 15
        while (_ours(tag) or list(tmp.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [c for _, c in _ours(tag)]
    finally:
        proc.kill()
        for pid, _ in _ours(tag):  # on failure: no orphan outlives the test either
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert left == []
    assert sorted(p.name for p in tmp.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_repro_where_every_process_sees_cuda(tmp_path):
    # A sitecustomize makes torch report one CUDA device in the parent, torchrun and every rank, as
    # on a GPU machine: the harness still runs on CPU and reproduces the case.
    (tmp_path / "sitecustomize.py").write_text(
        "import torch\ntorch.cuda.is_available = lambda: True\ntorch.cuda.device_count = lambda: 1\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "nanscope.cli.main", "repro", "--hazard", "kl-exp-overflow",
            "--json", str(tmp_path / "r.json")]  # fmt: skip
    proc = subprocess.run(argv, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (doc["observed"], doc["frames_match_case"]) == ("nan-check", True)
    assert all(", device cpu, " in r["error"] for r in doc["ranks"])


def test_an_output_named_as_a_plugin_report_in_the_report_dir_is_refused(tmp_path, capsys):
    argv = ["repro", "--hazard", "kl-exp-overflow", "--steps", "2", "--plugin", "--report-dir", str(tmp_path)]
    assert main([*argv, "--json", str(tmp_path / "rollout1_step0_rank2.json")]) == 2
    assert capsys.readouterr().err == (
        f"nanscope repro: error: --json {tmp_path}/rollout1_step0_rank2.json: a name the plugin's reports take in "
        f"--report-dir {tmp_path}: the run would replace it (give another name or directory)\n"
    )
