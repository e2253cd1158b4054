"""Issue 41, round 18: the class holdout18 (4 reports doctor had never read, graded on main 76f229b) read wrong, on
crafted input of its class. The test fails on round 17's doctor (main 76f229b)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. a verb between a name and its NaN (yifan123/flow_grpo#177: `print("log_prob is nan")`): the name is the metric
@pytest.mark.parametrize("line", ['-> print("log_prob is nan")', "step 3: log_prob was nan"])
def test_1_the_name_before_a_verb_is_the_metric(tmp_path, capsys, line):
    doc, out = _doctor(tmp_path, capsys, line + "\n")
    assert doc["summary"]["metric"] == "log_prob"
    assert "The first non-finite metric: log_prob" in out
