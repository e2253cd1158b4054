"""Issue 41's holdout sets 12-26 (tests/fixtures/reports/holdouts/README.md), consumed: on every report, a text that
shows a failure is read (exit 0) and only a launch script alone may be refused (exit 2, one line on stderr); no run
whose text names another stack is called slime's; no Python traceback of doctor's own."""

import json
from pathlib import Path

import pytest

from nanscope.cli.main import main

HOLDOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "holdouts"
REPORTS = sorted(md.with_suffix("") for md in HOLDOUTS.glob("h*/[0-9][0-9].md"))


# where a non-slime run's reading may name slime (holdout21 02 was told "slime's placement order", "slime's loss")
_SLIME_MENTIONS = ("slime's rules do not apply", "THUDM/slime#", "not from slime v0.1.0")


@pytest.mark.slow  # the sweep over every holdout set; each set's classes are tested in the fast tier
@pytest.mark.timeout(300)  # 245 reports, in process: a few seconds
def test_every_holdout_report_is_read_or_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert len(REPORTS) == 245
    refused, slime = [], []
    for report in REPORTS:
        args = [str(report.with_suffix(".sh"))] if report.with_suffix(".sh").exists() else []
        if report.with_suffix(".txt").exists():
            args += ["--traceback", str(report.with_suffix(".txt"))]
        out = tmp_path / "d.json"
        out.unlink(missing_ok=True)
        code = main(["doctor", *args, "--json", str(out)])
        captured = capsys.readouterr()
        err = captured.err
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
        else:  # slime named only to say its rules do not apply, in a citation, or as a source nanscope holds
            text = " ".join(captured.out.replace("│", " ").split())
            for allowed in _SLIME_MENTIONS:
                text = text.replace(allowed, "")
            assert "slime" not in text, (report, text[max(0, text.find("slime") - 200) : text.find("slime") + 100])
    assert slime == ["h12/14"]  # NVIDIA-NeMo/ProRL-Agent-Server#40: slime's own train/ keys
    assert refused == ["h12/15", "h12/27", "h13/19", "h13/20", "h13/22", "h14/09", "h14/20"], refused
