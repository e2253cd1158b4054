"""docs/cause.md says what the commands it names really give: §1's JSON keys are `repro --json`'s, §6's claim about
`hazards --loss safe` is the table's."""

import json
import pathlib
import re

from nanscope.cli.main import main
from nanscope.megatron.spec import RankRecord
from nanscope.report import repro as report
from nanscope.repro import Repro

CAUSE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "cause.md"


def _section(number: int) -> str:
    text = CAUSE.read_text()
    start = text.index(f"\n## {number}. ")
    return text[start : text.index("\n## ", start + 1)]


def _paragraph(section: str, marker: str) -> str:
    """The paragraph (or list item) of `section` that holds `marker`, its lines joined."""
    return next(" ".join(p.split()) for p in re.split(r"\n\s*\n|\n- ", section) if marker in p)


def test_section_1_names_the_keys_repro_json_has():
    said = _paragraph(_section(1), "--json out.json")
    keys = re.findall(r"`([a-z_]+(?:\[\]\.[a-z_]+)?)`", said.split("the JSON's", 1)[1])
    assert keys == ["ranks[].frames", "case_frames", "frames_match_case"]
    frame = ("rerun_state_machine.py", 505, "validate_result")
    record = RankRecord(rank=3, pp=1, tp=1, dp=0, ep=0, layers=[2, 3], holds_output_layer=True, ok=False)
    record.frames = [frame]
    rep = Repro("kl-exp-overflow", "as-is", "nan-check", "nan-check", {}, ranks=[record], first_failure=3)
    doc = report.to_json(rep)
    assert doc["ranks"][0]["frames"] == [list(frame)]  # [file, line, function], as the sentence says
    assert all(key.split("[]")[0] in doc for key in keys)
    assert "frames" not in doc  # the key the sentence used to name


def test_section_6_names_each_hazard_whose_safe_gradient_is_not_finite(tmp_path, capsys):
    assert main(["hazards", "--loss", "safe", "--json", str(tmp_path / "h.json")]) == 0
    capsys.readouterr()
    rows = json.loads((tmp_path / "h.json").read_text())["hazards"]
    said = _paragraph(_section(6), "nanscope hazards --loss safe")
    assert all(row["loss_finite"] for row in rows) and "a finite loss on every hazard of the loss" in said
    not_finite = [row["name"] for row in rows if not row["grad_finite"]]
    assert not_finite == ["zero-temperature"]
    assert "a finite gradient on all but zero-temperature" in said and "finite everywhere" not in said


def test_the_count_of_causes_left_for_the_case_is_doctors(tmp_path, capsys):
    """Issue 42 newcomer item 3: the page said "eleven remain" where doctor gives 15."""
    said = re.search(
        r"For the case, (\d+) remain \((\d+) enabled, (\d+) undecidable; (\d+) ruled out\)", CAUSE.read_text()
    )
    assert said is not None
    assert main(["doctor", "--case", "slime-795", "--json", str(tmp_path / "d.json")]) == 0
    statuses = [c["status"] for c in json.loads((tmp_path / "d.json").read_text())["candidates"]]
    counts = [statuses.count(s) for s in ("enabled", "undecidable", "ruled-out")]
    assert [int(n) for n in said.groups()] == [counts[0] + counts[1], *counts]
    assert f"{counts[0] + counts[1]} catalogued causes remain" in " ".join(capsys.readouterr().out.split())
