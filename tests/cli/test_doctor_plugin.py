"""nanscope doctor reads nanscope's own plugins (issue 43): the report file the verl plugin writes, the line naming
it in a verl log (and the report that line names, where it is), the plugins' warning lines, slime's line.

tests/fixtures/verl_plugin holds what the verl plugin wrote in tests/verl/test_h_critic.py's raise case (verl 0.9.0's
critic TrainingWorker, 2 gloo ranks, rank 1's model.layers.1.mlp made to output NaN): rollout0_step0_rank1.json, its
report, and critic.log, the plugin's lines of both ranks' output (their report directory renamed nanscope_reports).
"""

import json
import shutil
from pathlib import Path

from nanscope.cli.main import main
from nanscope.launch import plugin_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verl_plugin"
REPORT = FIXTURES / "rollout0_step0_rank1.json"
SAID = "first non-finite at model.layers.1.mlp (forward, micro-batch 0); class model-forward; rerun: reproducible"


def _doctor(tmp_path, capsys, path: Path) -> dict:
    out = tmp_path / "d.json"
    assert main(["doctor", "--traceback", str(path), "--json", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return json.loads(out.read_text())


def _signals(doc: dict) -> dict:
    return {s["check"]: s for s in doc["signals"]["signals"]}


def test_the_verl_plugins_report_file_is_read_as_its_line(tmp_path, capsys):
    report = tmp_path / REPORT.name
    shutil.copy(REPORT, report)
    doc = _doctor(tmp_path, capsys, report)
    summary = doc["summary"]
    assert (summary["rank"], summary["check"], summary["op"], summary["step"]) == (1, "nanscope-report",
                                                                                   "model.layers.1.mlp", 0)  # fmt: skip
    assert doc["framework"]["name"] == "verl"
    hit = _signals(doc)["nanscope-report"]
    assert hit["text"] == f"nanscope: rank 1: non-finite values in the critic's update 0 mini-batch 0: {report}"
    assert hit["detail"].startswith("the critic's update 0 mini-batch 0, its report") and SAID in hit["detail"]


def test_the_plugins_line_in_a_verl_log_reads_the_report_it_names_where_it_is(tmp_path, capsys, monkeypatch):
    log = tmp_path / "job.log"
    shutil.copy(FIXTURES / "critic.log", log)
    monkeypatch.chdir(tmp_path)
    away = _signals(_doctor(tmp_path, capsys, log))["nanscope-report"]
    assert away["rank"] == 1 and "not readable here" in away["detail"] and away["op"] is None
    (tmp_path / "nanscope_reports" / "critic").mkdir(parents=True)
    shutil.copy(REPORT, tmp_path / "nanscope_reports" / "critic" / REPORT.name)
    doc = _doctor(tmp_path, capsys, log)
    here = _signals(doc)["nanscope-report"]
    assert here["line"] == 2 and here["op"] == "model.layers.1.mlp" and SAID in here["detail"]
    assert doc["framework"]["name"] == "verl" and doc["summary"]["rank"] == 1


def test_the_plugins_warning_lines_are_read_cleaned_inputs_and_headroom(tmp_path, capsys):
    from nanscope.slime_plugin.logs import warnings_for  # the plugins' own warning texts
    from nanscope.slime_plugin.settings import Settings

    settings = Settings.from_env({}, verl=True)
    texts = [text for _, text in warnings_for({"nanscope/nonfinite_inputs": 1.0}, {}, settings)]
    texts += [text for _, text in warnings_for({"nanscope/max_ppo_log_ratio": 95.21}, {}, settings)]
    # the verl plugin's head (verl_plugin/watch.py:269, 274-275), inside Ray's worker prefix
    lines = [f"(WorkerDict pid=9) nanscope: warning: actor update {u} mini-batch 0: {t}" for u, t in enumerate(texts)]
    (tmp_path / "job.log").write_text("\n".join(["(WorkerDict pid=9) step:1 - actor/pg_loss:0.1", *lines]) + "\n")
    doc = _doctor(tmp_path, capsys, tmp_path / "job.log")
    found = _signals(doc)
    cleaned, headroom = found["nanscope-cleaned"], found["nanscope-headroom"]
    assert cleaned["line"] == 2 and cleaned["step"] == 0 and "1 non-finite loss input entries" in cleaned["detail"]
    assert headroom["line"] == 3 and headroom["step"] == 1 and "max_ppo_log_ratio = 95.21 > 60" in headroom["detail"]
    assert cleaned["printed_by"] == headroom["printed_by"] == ["verl"]


def test_the_slime_plugins_line_is_read_too(tmp_path, capsys):
    line = "nanscope: rank 3: non-finite values at rollout 7 step 1: /nowhere/rollout7_step1_rank3.json; to name ...\n"
    (tmp_path / "job.log").write_text(line)
    hit = _signals(_doctor(tmp_path, capsys, tmp_path / "job.log"))["nanscope-report"]
    assert (hit["rank"], hit["step"], hit["printed_by"]) == (3, 7, ["slime"])
    assert hit["detail"].startswith("rollout 7 step 1, its report /nowhere/rollout7_step1_rank3.json (not readable")


def test_a_json_file_that_is_no_plugin_report_is_read_as_a_log(tmp_path, capsys):
    other = tmp_path / "metrics.json"
    other.write_text(json.dumps({"rank": 1, "loss": "nan"}))
    assert plugin_report.read(str(other)) is None
    doc = _doctor(tmp_path, capsys, other)
    assert "nanscope-report" not in _signals(doc)


def test_a_report_parses_and_says_itself_in_one_sentence():
    report = plugin_report.parse(json.loads(REPORT.read_text()))
    assert (report.rank, report.role, report.update, report.step, report.module) == (1, "critic", 0, 0,
                                                                                     "model.layers.1.mlp")  # fmt: skip
    assert report.text().startswith(SAID)
    said = plugin_report.match(plugin_report.line(report, "x/rollout0_step0_rank1.json"))
    assert (said.plugin, said.rank, said.role, said.path) == ("verl", 1, "critic", "x/rollout0_step0_rank1.json")
    for bad in ({}, [], {"rank": 1}):
        try:
            plugin_report.parse(bad)
        except ValueError as e:
            assert "not a nanscope plugin report" in str(e)
        else:
            raise AssertionError(bad)
