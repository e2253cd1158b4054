"""Issue 41 item 6: real public NaN reports of many stacks, each kept as its pasted text alone
(tests/fixtures/reports/real/<id>.txt, and <id>.sh where the report pasted its launch command), with what the text
supports (expected.json: rank, kind, check, step, model, metric, framework or an honest "unknown"; `note` says where
this reading differs from a first annotation, and why). doctor reads each, alone and beside its script."""

import json
from pathlib import Path

import pytest

from nanscope.cli.main import main

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "real"
EXPECTED = json.loads((REAL / "expected.json").read_text())
FIELDS = ("rank", "kind", "check", "step", "model", "metric")
SLIME_WORDS = ("--rollout-temperature", "--tis-clip", "--save-debug-rollout-data", "slime's", "the plugin")


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")


def _doctor(tmp_path, capsys, *argv: str) -> tuple[dict, str]:
    out = tmp_path / "d.json"
    code = main(["doctor", *argv, "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), captured.out


@pytest.mark.parametrize("report", sorted(EXPECTED), ids=sorted(EXPECTED))
def test_a_real_report_reads_as_its_text_supports(report, tmp_path, capsys):
    want = EXPECTED[report]
    doc, out = _doctor(tmp_path, capsys, "--traceback", str(REAL / f"{report}.txt"))
    assert {key: doc["summary"][key] for key in FIELDS} == {key: want[key] for key in FIELDS}, want.get("note")
    assert doc["framework"]["name"] == want["framework"]
    first = doc["metrics"]["first_nonfinite"]
    if "after_step" in want:
        assert first["after_step"] == want["after_step"]
    for key in want.get("also", []):
        assert key in [pair[0] for pair in first["values"]]
    said = " ".join([doc["verdict"], *doc["notes"], *(c["discriminator"] or "" for c in doc["candidates"])])
    assert not [word for word in SLIME_WORDS if word in said], said  # none of these is a slime job
    assert "Traceback (most recent call last)" not in out.split("traceback, frame by frame")[0]


@pytest.mark.parametrize("report", sorted(p.stem for p in REAL.glob("*.sh")))
def test_a_real_report_beside_its_launch_command(report, tmp_path, capsys):
    want = EXPECTED[report]
    doc, _ = _doctor(tmp_path, capsys, str(REAL / f"{report}.sh"), "--traceback", str(REAL / f"{report}.txt"))
    assert {key: doc["summary"][key] for key in FIELDS} == {key: want[key] for key in FIELDS}
    assert doc["slime_release"] is None
