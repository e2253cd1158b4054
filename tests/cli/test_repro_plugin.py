"""`nanscope repro --plugin`: slime with nanscope's plugin installed as documented, through argv.

The raise run's report at the hazard's step prints its replay instruction; its repro bundles, left in
./nanscope_reports, replay offline (no second launch) and name the op, source line, sample and response token. Skip mode skips exactly that step with a NaN grad norm and logs
nanscope/skipped_steps; NANSCOPE_MAX_SKIPS ends the run.
"""

import inspect
import json
import os

import pytest

from nanscope.cli.main import main
from nanscope.loss import formulas


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """repro's lines read whole at 160 columns, its width before issue 42 (the rule: tests/cli/test_terminal.py)."""
    monkeypatch.setenv("COLUMNS", "160")


def _exp_line() -> int:
    lines, start = inspect.getsourcelines(formulas.approx_kl)
    (hit,) = [start + i for i, line in enumerate(lines) if ".exp()" in line]
    return hit


@pytest.mark.slow  # several steps x 4 runs; the fast tier runs the hook in the harness (tests/slime_plugin/test_hook.py)
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_plugin_report_at_the_hazard_step_replays_to_the_exp_in_the_kl(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NANSCOPE_MAX_SKIPS", raising=False)
    monkeypatch.chdir(tmp_path)  # the bundles are left in ./nanscope_reports
    out = tmp_path / "out.json"
    # an untidy report directory: a link at a report's name (replaced, never followed), a directory at a bundle's
    left = tmp_path / "nanscope_reports"
    (left / "rollout1_step0_rank3.bundle.pt").mkdir(parents=True)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (left / "rollout1_step0_rank0.json").symlink_to(precious)
    argv = [
        "repro",
        "--hazard",
        "kl-exp-overflow",
        "--steps",
        "3",
        "--inject-step",
        "2",
        "--plugin",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    doc = json.loads(out.read_text())
    sample, token = doc["as_is"]["hazard_site"]
    assert doc["ok"] and doc["as_is_died_at"] == 2 and doc["safe_steps_completed"] == 3
    plugin = doc["plugin"]
    # Every rank reported step 2 (rollout 1: one optimizer step per rollout), with the same instruction.
    assert sorted(r["rank"] for r in plugin["reports"]) == [0, 1, 2, 3]
    instruction = {r["replay"]["text"] for r in plugin["reports"]}
    assert len(instruction) == 1 and {(r["rollout_id"], r["step_id"]) for r in plugin["reports"]} == {(1, 0)}
    (said,) = instruction
    assert said.startswith(
        "rerun from the checkpoint before rollout 1 with NANSCOPE_TRACE_STEP=1:0 in the "
        "environment and --load-debug-rollout-data "
    )
    # the rollouts' path it names was the harness's temporary directory: said, as it is gone
    scratch = said.split("--load-debug-rollout-data ")[1].split("/rollouts.")[0]
    assert not os.path.exists(scratch) and plugin["scratch_dir"] == scratch
    assert (
        f"the report says: {said} ({scratch} was the harness's temporary directory, removed when the run ended; in a "
        "slime run the path is where the run saved its rollouts (--save-debug-rollout-data); the replay below needs "
        "only the bundles) replay offline, as `nanscope trace nanscope_reports` does (4 bundles, "
    ) in text
    # the headline follows the reports' producer (the loss's rank), whichever rank raised first
    raised = doc["as_is"]["first_failure"]
    assert (
        "plugin: ranks 0-3 reported rollout 1 step 0 (harness step 2); the first non-finite value (the rerun's "
        f"producer): rank 2 (pp 1, tp 0), module 'output_layer', backward, micro-batch {sample}, class loss-numerics; "
        f"rank {raised} raised Megatron's error first the report says: "
    ) in text
    # The replay, offline from the bundles: exp in approx_kl on the last stage (the loss), then ExpBackward0's mul, at
    # the hazard's token; the guard makes both finite.
    replay = plugin["replay"]
    assert (
        replay["found"]
        and replay["class"] == "loss-numerics"
        and replay["guard_finite"]
        and replay["ranks_traced"] == 4
    )
    fwd, bwd = replay["forward"], replay["backward"]
    source = f"nanscope/loss/formulas.py:{_exp_line()} in approx_kl `k3 = (-log_ratio).exp() - 1 + log_ratio`"
    assert (fwd["op"], fwd["module"], fwd["source"], fwd["sample"], fwd["token"], fwd["masked"]) == (
        "aten.exp.default",
        None,
        source,
        sample,
        token,
        True,
    )
    assert fwd["pp"] == 1 and fwd["microbatch"] == sample  # one sample per micro-batch in the harness
    assert (bwd["op"], bwd["node"], bwd["source"], bwd["sample"], bwd["token"], bwd["pp"]) == (
        "aten.mul.Tensor",
        "ExpBackward0",
        source,
        sample,
        token,
        1,
    )
    # The bundles left behind: `nanscope trace` on the last stage's names the same, exit 1.
    assert plugin["report_dir"] == "nanscope_reports" and sorted(p.name for p in left.glob("*.bundle.pt")) == [
        f"rollout1_step0_rank{r}.bundle.pt" for r in range(4)
    ]
    assert precious.read_text() == "keep me" and not (left / "rollout1_step0_rank0.json").is_symlink()
    assert json.loads((left / "rollout1_step0_rank0.json").read_text())["rank"] == 0
    blocked = "nanscope_reports/rollout1_step0_rank3.bundle.pt: Is a directory"
    assert plugin["report_dir_left_out"] == [blocked] and f"warning: not left in --report-dir: {blocked}" in text
    capsys.readouterr()
    assert main(["trace", str(left / "rollout1_step0_rank2.bundle.pt")]) == 1
    assert (
        f"verdict: the NaN starts in the loss: aten.exp.default at {source.split(' `')[0]}, sample {sample}, "
        f"response token {token}, loss_mask 0 (masked)\n"
    ) in capsys.readouterr().out
    # Skip mode: step 2 skipped on every rank with a NaN grad norm, the run goes on; the log says so.
    skip = plugin["skip"]
    assert skip["observed"] == "completed" and skip["skipped_steps"] == [1, 1, 1, 1]
    for r in skip["ranks"]:
        norms = r["optimizer_grad_norm"]
        assert norms[1] != norms[1] and all(n > 0 for n in norms[:1] + norms[2:]) and r["params_finite"]
    assert [(e["rollout_id"], e["nanscope/skipped_steps"]) for e in skip["log"]] == [(0, 0), (1, 1), (2, 1)]
    assert "nanscope/skipped_steps logged per step: 0, 1, 1" in text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_max_skips_stops_the_skip_run(tmp_path, monkeypatch):
    monkeypatch.setenv("NANSCOPE_MAX_SKIPS", "1")
    out = tmp_path / "out.json"
    argv = [
        "repro",
        "--hazard",
        "kl-exp-overflow",
        "--steps",
        "2",
        "--inject-step",
        "2",
        "--plugin",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    skip = json.loads(out.read_text())["plugin"]["skip"]
    assert skip["observed"] == "error" and skip["expected"] == "error" and skip["skipped_steps"] == [1, 1, 1, 1]
    for r in skip["ranks"]:
        assert r["error"].startswith(
            "nanscope: 1 step(s) in a row had non-finite gradients (the last: rollout 1 "
            "step 0); NANSCOPE_MAX_SKIPS=1: stopping the run."
        )


@pytest.mark.parametrize(
    "argv,env,message",
    [
        (["--plugin"], {}, "--plugin goes with --hazard NAME --steps N (the hazard at --inject-step, then its replay)"),
        (
            ["--hazard", "kl-exp-overflow", "--plugin"],
            {},
            "--plugin goes with --hazard NAME --steps N (the hazard at --inject-step, then its replay)",
        ),
        (
            ["--hazard", "kl-exp-overflow", "--steps", "2", "--report-dir", "r"],
            {},
            "--report-dir r goes with --plugin (the plugin's reports and bundles)",
        ),
        (
            ["--hazard", "kl-exp-overflow", "--steps", "2", "--plugin", "--report-dir", "pyproject.toml"],
            {},
            "--report-dir pyproject.toml: not a directory",
        ),
        (
            ["--hazard", "kl-exp-overflow", "--steps", "2", "--plugin"],
            {"NANSCOPE_MAX_SKIPS": "0"},
            "NANSCOPE_MAX_SKIPS='0': expected an integer >= 1",
        ),
    ],
)
def test_plugin_input_errors_are_one_line_before_any_launch(argv, env, message, capsys, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["repro", *argv]) == 2
    assert capsys.readouterr().err == f"nanscope repro: error: {message}\n"


def _report(rank: int, first_backward: str) -> dict:
    """A rank's report at the hazard's step, the fields the headline reads (from a kl-exp-overflow run's reports:
    every rank holds the same rerun producer, the loss's rank 2; each its own first module in backward order)."""
    producer = {"rank": 2, "pp": 1, "tp": 0, "node": "vm", "device": "cpu", "module": "output_layer",
                "direction": "backward", "microbatch": 2, "class": "loss-numerics"}  # fmt: skip
    return {
        "rank": rank, "rollout_id": 1, "step_id": 0, "first_forward": None,
        "first_backward": {"module": first_backward, "microbatch": 2}, "replay": {"text": "rerun ..."},
        "rerun": {"verdict": "reproducible", "producer": producer},
    }  # fmt: skip


def test_the_plugin_headline_follows_the_producer_not_the_first_rank_to_raise():
    from nanscope.report import repro as report
    from nanscope.repro import PluginCheck, Repro

    fc2 = "decoder.layers.1.mlp.experts.local_experts.7.linear_fc2"
    reports = [_report(0, fc2), _report(1, fc2), _report(2, "output_layer"), _report(3, "output_layer")]
    # rank 0 (pp 0, an expert's fc2 the NaN reached in backward) raised first, by wall clock
    raised = Repro("kl-exp-overflow", "as-is", "nan-check", "nan-check", {}, first_failure=0)
    skipped = Repro("kl-exp-overflow", "as-is", "completed", "completed", {})
    check = PluginCheck(inject_step=2, raised=raised, skipped=skipped, max_skips=None, reports=reports, replay=None)
    assert report.plugin_lines(check)[0] == (
        "plugin: ranks 0-3 reported rollout 1 step 0 (harness step 2); the first non-finite value (the rerun's "
        "producer): rank 2 (pp 1, tp 0), module 'output_layer', backward, micro-batch 2, class loss-numerics; rank 0 "
        "raised Megatron's error first"
    )
    # without a rerun (NANSCOPE_RERUN=off) there is no producer across ranks: the first to raise's, said so
    for r in reports:
        r["rerun"] = None
    assert report.plugin_lines(check)[0] == (
        "plugin: ranks 0-3 reported rollout 1 step 0 (harness step 2); rank 0's first non-finite: module "
        f"'{fc2}', micro-batch 2; rank 0 raised Megatron's error first (no rerun in the reports: no producer "
        "across ranks)"
    )
