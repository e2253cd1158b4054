"""`nanscope repro --natural`: nothing planted; the GRPO loop's own training kills as-is, the plugin trains through.

The slow test replaces the planted logprob-drift's (a hazard whose log-ratio grows by a set amount each step, kept
for scan and doctor): here the series is what training made, and the warning's lead is measured, not tuned.
"""

import json
import math

import pytest

from nanscope import case
from nanscope.cli.main import main
from nanscope.facts.numerics import FP32_EXP_MAX

# Seed 2 dies at step 10 at lr 1e-3 on the 2-core box (benchmarks/README.md, natural); 16 steps bound both runs.
SEED, STEPS = 2, 16


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """repro's lines read whole at 160 columns, its width before issue 42 (the rule: tests/cli/test_terminal.py)."""
    monkeypatch.setenv("COLUMNS", "160")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_training_drives_the_kls_exp_past_fp32_as_is_dies_and_the_plugin_trains_through(
    tmp_path, capsys, monkeypatch, wide_lines
):  # wide_lines: at 160 columns the differences table folds its long cells; its rows are asserted whole
    for name in ("NANSCOPE_MAX_SKIPS", "NANSCOPE_WARN_LOG_RATIO", "NANSCOPE_ON_NONFINITE"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "n.json"
    argv = ["repro", "--natural", "--seed", str(SEED), "--steps", str(STEPS), "--timeout", "1100", "--json", str(out)]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    doc = json.loads(out.read_text())
    natural = doc["natural"]
    assert doc["ok"] and (natural["seed"], natural["steps"], natural["lr"]) == (SEED, STEPS, 1e-3)
    as_is, series = natural["as_is"], natural["series"]
    died = as_is["died_at_step"]
    assert died is not None and 3 <= died <= STEPS
    # the case's error, through megatron-core's bucket check, from a rank of the harness
    assert as_is["message"].startswith("Rank ") and as_is["message"].endswith(f": {case.nan_check_message()}")
    assert as_is["frames_match_case"] and as_is["same_until_death"]
    # one entry per step; at step 1 the policy is the reference model (its initial weights): the training forward's
    # log-probs are the log-prob passes' up to fp32 rounding (measured: 1.2e-7 at TP 2)
    assert [entry["step"] for entry in series] == list(range(1, STEPS + 1))
    assert 0.0 <= series[0]["max_kl_log_ratio"] < 1e-5 and 0.0 <= series[0]["max_ppo_log_ratio"] < 1e-5
    # nothing crosses before the death, the KL's exp does at it, on a masked tool token
    crossing = natural["crossing"]
    assert all(max(e[m] for m in ("max_kl_log_ratio", "max_ppo_log_ratio", "max_tis_log_ratio")) <= FP32_EXP_MAX
               for e in series[: died - 1])  # fmt: skip
    assert (crossing["exp"], crossing["metric"], crossing["step"]) == ("KL", "max_kl_log_ratio", died)
    assert crossing["masked"] and crossing["span"][0] <= crossing["token"] < crossing["span"][1]
    assert crossing["log_ratio"] == series[died - 1]["max_kl_log_ratio"] > FP32_EXP_MAX
    assert math.isclose(crossing["ref_log_prob"] - crossing["log_prob"], crossing["log_ratio"], abs_tol=1e-3)
    assert crossing["ref_log_prob"] > -FP32_EXP_MAX  # the reference found the tool's token plausible enough
    # the plugin: every step finite, the overflow counted where as-is died, warned 2 steps ahead at 20 / 60
    plugin = natural["plugin"]
    assert plugin["steps"] == plugin["finite_steps"] == STEPS and plugin["run"]["observed"] == "completed"
    assert plugin["exp_overflow_per_step"][died - 1] == series[died - 1]["exp_overflow"] >= 1
    assert plugin["exp_overflow"] == sum(plugin["exp_overflow_per_step"]) == sum(e["exp_overflow"] for e in series)
    first = plugin["warned_steps"][0]
    assert first <= died - 2
    value = max(series[first - 1][m] for m in ("max_kl_log_ratio", "max_ppo_log_ratio", "max_tis_log_ratio"))
    assert plugin["warnings"][0].startswith(f"rollout {first - 1} step 0: nanscope/max_kl_log_ratio = {value:.4g} > 20")
    # every difference from the case is printed, the learning rate with its factor
    assert [row["what"] for row in natural["differences"]] == [
        "model", "device", "sampler", "environment", "reward", "lengths", "batch", "learning rate"
    ]  # fmt: skip
    assert "│ learning rate │ 1e-06, constant │ 0.001, constant (1000x) │" in text
    assert f"as expected: seed {SEED}, lr 0.001: as-is died at step {died} through megatron-core's bucket check" in text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--natural", "--hazard", "healthy"], "--natural runs its own loop (as-is and the plugin): not with --hazard"),
        (["--natural", "--plugin"], "--natural runs its own loop (as-is and the plugin): not with --plugin"),
        (["--natural", "--loss", "safe"], "--natural runs its own loop (as-is and the plugin): not with --loss"),
        (
            ["--natural", "--steps", "4", "--inject-step", "2"],
            "--natural runs its own loop (as-is and the plugin): not with --inject-step",
        ),  # fmt: skip
        (["--lr", "1e-3"], "--lr 0.001 goes with --natural"),
    ],
)
def test_natural_input_errors_are_one_line_before_any_launch(argv, message, capsys):
    assert main(["repro", *argv]) == 2
    assert capsys.readouterr().err == f"nanscope repro: error: {message}\n"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--natural", "--lr", "0"], "argument --lr: '0': expected a number > 0 and <= 1"),
        (["--natural", "--lr", "nan"], "argument --lr: 'nan': expected a number > 0 and <= 1"),
        (["--natural", "--steps", "0"], "argument --steps: '0': expected an integer from 1 to 100"),
        (["--natural", "--steps", "101"], "argument --steps: '101': expected an integer from 1 to 100"),
    ],
)
def test_natural_bad_numbers_are_argparses_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:  # nanscope.cli.numbers' types
        main(["repro", *argv])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"nanscope repro: error: {message}")


def _record(rank: int, series: list, norms: list, **kw):
    from nanscope.megatron.spec import RankRecord

    last = rank >= 2  # TP2 x PP2: ranks 2 and 3 hold the output layer
    return RankRecord(rank=rank, pp=int(last), tp=rank % 2, dp=0, ep=0, layers=[], holds_output_layer=last, ok=True,
                      optimizer_grad_norm=norms, params_finite=True, series=series if last else [], **kw)  # fmt: skip


def test_a_run_that_never_crossed_says_so_and_exits_1(tmp_path, capsys, monkeypatch):
    from nanscope import natural
    from nanscope.repro import Repro

    at = {"sample": 0, "token": 9, "masked": True, "span": [8, 12], "log_prob": -60.0, "ref_log_prob": -30.0,
          "old_log_prob": -60.0}  # fmt: skip
    series = [
        {"step": i, "reward": 0.5, "rewards": [0.5] * 8, "entropy": 0.9, "max_kl_log_ratio": 30.0,
         "max_ppo_log_ratio": 0.0, "max_tis_log_ratio": 0.01, "train_rollout_gap_max": 0.01,
         "max_kl_log_ratio_trained": 1.0, "mean_kl_log_ratio_tool": 2.0, "min_tool_log_prob": -90.0, "exp_overflow": 0,
         "at": {name: at for name in ("max_kl_log_ratio", "max_ppo_log_ratio", "max_tis_log_ratio")}}
        for i in (1, 2, 3)
    ]  # fmt: skip
    layout = {"tp": 2, "pp": 2, "dp": 1, "ep": 1, "cp_loss_level": 1}

    def run(**kw):
        runs = [Repro("healthy", loss, expected, "completed", layout,
                      ranks=[_record(r, series, [1.0, 1.0, 1.0]) for r in range(4)])
                for loss, expected in (("as-is", "nan-check"), ("safe", "completed"))]  # fmt: skip
        return natural.NaturalCheck(seed=kw["seed"], steps=kw["steps"], lr=kw["lr"], as_is=runs[0], plugin=runs[1],
                                    wall_s=1.0, notes=[])  # fmt: skip

    monkeypatch.setattr(natural, "run_natural", run)
    out = tmp_path / "n.json"
    assert main(["repro", "--natural", "--seed", "5", "--steps", "3", "--json", str(out)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    doc = json.loads(out.read_text())
    assert not doc["ok"] and doc["natural"]["as_is"]["died_at_step"] is None and doc["natural"]["crossing"] is None
    assert doc["natural"]["plugin"]["warned_steps"] == [] and doc["natural"]["plugin"]["finite_steps"] == 3
    assert doc["verdict"] == (
        "UNEXPECTED: seed 5, lr 0.001: as-is did not die in 3 steps (completed); with the plugin 3/3 steps finite, "
        "nan_guard/exp_overflow 0 tokens, NO warning"
    )
    assert "as-is: completed in 3 steps" in text
    monkeypatch.setenv("COLUMNS", "80")  # issue 42: the ten-column series table cut its words mid-word at 80
    assert main(["repro", "--natural", "--seed", "5", "--steps", "3"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and lines.index("step 1") + 5 == lines.index("  on tool tokens: mean: 2.00")
