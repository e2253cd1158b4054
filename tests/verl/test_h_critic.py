"""Issue 43, the critic (`value_model`): verl 0.9.0's own critic worker, the TrainingWorker its trainer builds
(trainer/ppo/v1/trainer_base.py:249-271, 305-308; tests/verl/rank.py: critic_worker), trained with
`train_mini_batch` as `_update_critic` does (:1649-1670), 2 gloo ranks, FSDP2 on CPU. A test-only hook makes rank 1's
model.layers.1.mlp output NaN. The plugin comes in through VERL_USE_EXTERNAL_MODULES, the one path that reaches the
critic's process before its engine is built (engine_workers.py:135, in the worker's constructor): the engine is
nanscope's subclass of verl's FSDPEngineWithValueHead. Raise mode: every rank raises, rank 0's error naming rank 1,
and rank 1's report, under NANSCOPE_REPORT_DIR/critic/, names the critic, the module and micro-batch 0. Skip mode
(the first pass only): every rank skips, the parameters unchanged. `nanscope doctor` reads the report the plugin
wrote (tests/cli/test_doctor_plugin.py reads a copy of one, tests/fixtures/verl_plugin)."""

import json
import math

import pytest

from nanscope.cli.main import main
from tests.verl import harness, plugin

pytestmark = pytest.mark.timeout(600)


def _spec(tmp_path, **fields) -> harness.Spec:
    env = plugin.with_reports(tmp_path, fields.pop("env", {}))
    return harness.Spec(role="critic", install="env", env=env, **fields)


def test_h_a_critic_layer_faulty_on_every_pass_raises_on_every_rank_with_the_critics_report(
    tmp_path, critic_model, capsys
):
    ranks = harness.run(_spec(tmp_path, fault="every"), tmp_path, critic_model)
    for rank in ranks:
        assert rank.engine == "nanscope.verl_plugin.engine.NanscopeFSDPEngineWithValueHead", rank.engine
        assert rank.error is not None and "critic" in rank.error, rank.error
    assert "rank(s) 1" in ranks[0].error, ranks[0].error
    reports = sorted((tmp_path / "reports" / "critic").glob("*.json"))
    assert [p.name for p in reports] == ["rollout0_step0_rank1.json"], reports
    report = json.loads(reports[0].read_text())
    assert report["role"] == "critic" and report["rank"] == 1
    assert report["first_forward"]["module"] == harness.FAULT_MODULE and report["first_forward"]["microbatch"] == 0
    assert report["rerun"]["verdict"] == "reproducible"
    assert not list((tmp_path / "reports").glob("*.json"))  # the actor's place holds nothing
    capsys.readouterr()
    assert main(["doctor", "--traceback", str(reports[0]), "--json", str(tmp_path / "doctor.json")]) == 0
    summary = json.loads((tmp_path / "doctor.json").read_text())["summary"]
    assert (summary["rank"], summary["check"], summary["op"]) == (1, "nanscope-report", harness.FAULT_MODULE)


def test_h_in_skip_mode_every_rank_skips_the_critics_step(tmp_path, critic_model):
    spec = _spec(tmp_path, fault="first", env={"NANSCOPE_ON_NONFINITE": "skip"})
    ranks = harness.run(spec, tmp_path, critic_model)
    for rank in ranks:
        assert rank.error is None and rank.engine.endswith("NanscopeFSDPEngineWithValueHead"), rank.error
        logged = rank.driver[0]
        assert math.isnan(logged["critic/grad_norm"]) and logged["critic/nanscope/skipped_steps"] == 1.0
        assert harness.same(rank.before, rank.after)
    found = sorted((tmp_path / "reports" / "critic").glob("*rank1.json"))
    assert len(found) == 1 and json.loads(found[0].read_text())["rerun"]["verdict"] == "not reproducible"
