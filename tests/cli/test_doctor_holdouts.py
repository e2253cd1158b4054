"""Issue 41's holdout sets 12-18 (tests/fixtures/reports/holdouts/README.md), consumed: on every report, a text that
shows a failure is read (exit 0) and only a launch script alone may be refused (exit 2, one line on stderr); no run
whose text names another stack is called slime's; no Python traceback of doctor's own."""

import json
from pathlib import Path

import pytest

from nanscope.cli.main import main

HOLDOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "holdouts"
REPORTS = sorted(md.with_suffix("") for md in HOLDOUTS.glob("h*/[0-9][0-9].md"))


@pytest.mark.timeout(300)  # 175 reports, in process: a few seconds
def test_every_holdout_report_is_read_or_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert len(REPORTS) == 175
    refused, slime = [], []
    for report in REPORTS:
        args = [str(report.with_suffix(".sh"))] if report.with_suffix(".sh").exists() else []
        if report.with_suffix(".txt").exists():
            args += ["--traceback", str(report.with_suffix(".txt"))]
        out = tmp_path / "d.json"
        out.unlink(missing_ok=True)
        code = main(["doctor", *args, "--json", str(out)])
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" not in err, report
        if code == 2:
            assert not report.with_suffix(".txt").exists() and err.count("\n") == 1, (report, err)
            refused.append(f"{report.parent.name}/{report.name}")
            continue
        assert code == 0, (report, err)
        said = report.with_suffix(".md").read_text()
        if json.loads(out.read_text())["framework"]["name"] == "slime":
            slime.append(f"{report.parent.name}/{report.name}")
            assert "slime" in said.lower(), report
    assert slime == ["h12/14"]  # NVIDIA-NeMo/ProRL-Agent-Server#40: slime's own train/ keys
    assert refused == ["h12/15", "h12/27", "h13/19", "h13/20", "h13/22", "h14/09", "h14/20"], refused
