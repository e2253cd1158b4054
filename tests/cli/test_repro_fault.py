"""`nanscope repro --fault` / `--list-modules`: input errors without a launch, then one real faulted run."""

import json

import pytest

from nanscope.cli.main import main


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """repro's lines read whole at 160 columns, its width before issue 42 (the rule: tests/cli/test_terminal.py)."""
    monkeypatch.setenv("COLUMNS", "160")


@pytest.mark.slow  # the fast tier runs --list-modules in tests/test_docs.py and tests/cli/test_outputs.py
def test_list_modules_prints_one_name_a_line(capsys):
    assert main(["repro", "--list-modules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 176 and lines[-1] == "output_layer"
    assert "decoder.layers.1.mlp.router" in lines and "decoder.layers.3.mlp.experts.local_experts.7" in lines


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--fault-step", "2"], "--fault-step 2 goes with --fault MODULE:forward|backward:nan|inf"),
        (
            ["--fault", "decoder.layers.0.mlp:forward:inf", "--steps", "3"],
            "--fault runs one hazard (--hazard, default healthy) up to --fault-step: not with --steps",
        ),
        (
            ["--fault", "decoder.layers.0.mlp:forward:inf", "--hazard", "activation-overflow"],
            "--fault: activation-overflow is a fault in the model already (decoder.layers.1.mlp:forward:inf)",
        ),
        (
            ["--fault", "decoder.layers.9.mlp:forward:inf"],
            "--fault decoder.layers.9.mlp:forward:inf: the harness model has no module 'decoder.layers.9.mlp' "
            "(`nanscope repro --list-modules` lists them)",
        ),
        (
            ["--fault", "decoder.layers.0.mlp:up:inf"],
            "--fault 'decoder.layers.0.mlp:up:inf': expected MODULE:forward|backward:nan|inf, "
            "e.g. decoder.layers.0.mlp:forward:inf"
            ", or EXPERT:zero-tokens:nan|inf, e.g. decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan",
        ),
        (
            ["--hazard", "zero-temperature", "--steps", "3"],
            "--steps shows the safe loss fixing a hazard over several steps; zero-temperature's fix lives in the launch "
            "flags: a positive --rollout-temperature (slime v0.1.0's arguments.py accepts 0): run it without --steps",
        ),
    ],
)
def test_bad_fault_arguments_are_one_line_before_any_launch(argv, message, capsys):
    assert main(["repro", *argv]) == 2
    assert capsys.readouterr().err == f"nanscope repro: error: {message}\n"


@pytest.mark.slow  # a whole launch (about 9 s); the fast tier checks --fault's arguments and repro's --trace launch
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_forward_fault_fails_the_check_and_the_sentinel_and_tracer_name_it(tmp_path, capsys):
    path = tmp_path / "f.json"
    assert main(["repro", "--fault", "decoder.layers.0.mlp:forward:inf", "--trace", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert (doc["hazard"], doc["fault"], doc["expected"], doc["observed"]) == (
        "healthy",
        "decoder.layers.0.mlp:forward:inf",
        "nan-check",
        "nan-check",
    )
    s = doc["sentinel"]
    # rank 0 (pipeline stage 0, which holds decoder layer 0) saw the planted module first, in the forward
    assert {k: s[k] for k in ("rank", "step", "module", "direction", "microbatch", "class")} == {
        "rank": 0,
        "step": 1,
        "module": "decoder.layers.0.mlp",
        "direction": "forward",
        "microbatch": 0,
        "class": "model-forward",
    }
    # that rank's tracer names the op that made the first inf: the planted value, inside the planted module
    fwd = doc["trace"]["forward"]
    assert doc["trace_rank"] == 0 and fwd["produced"] == "inf" and fwd["module"] == "decoder.layers.0.mlp"
    assert "faults.py" in fwd["source"]
    out = capsys.readouterr().out
    assert (
        "sentinel: rank 0 produced it first (step 1): module decoder.layers.0.mlp, forward, micro-batch 0; "
        "class model-forward"
    ) in out


@pytest.mark.slow  # a whole launch (about 10 s); test_repro_header.py renders its header in the fast tier
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_one_time_fault_shows_the_reruns_verdict_and_names_fault_once(tmp_path, capsys):
    """Issue 42 newcomer item 6: `--fault-once` looked like a persistent fault (no rerun verdict, the header without
    --fault-once). The plugin's hook, as installed, reruns the step: finite, so not reproducible (transient)."""
    path = tmp_path / "once.json"
    argv = ["repro", "--fault", "decoder.layers.1.mlp:forward:inf", "--fault-once", "--json", str(path), "--quiet"]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith(
        "nanscope repro --hazard healthy --loss as-is --fault decoder.layers.1.mlp:forward:inf --fault-once "
    )
    assert (
        "nanscope: rerun: not reproducible (transient): the rerun of the step is finite; first producer: rank 0, node "
    ) in text
    assert "device cpu (decoder.layers.1.mlp): check dmesg for XID and ECC errors" in text
    assert "nanscope-one-" not in text  # the hook's report, in the launch's temp directory, is not pointed at
    doc = json.loads(path.read_text())
    assert (doc["observed"], doc["expected"]) == ("nan-check", "nan-check")
