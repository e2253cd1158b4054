"""Issue 43, case C: a test-only hook makes rank 1's model.layers.1.mlp output NaN on every pass (a model-level
fault no loss guard can clean). With the plugin in raise mode (NANSCOPE_ON_NONFINITE's default) every rank raises
(within the harness's hard timeout), rank 0's error names rank 1, rank 1's report and bundle name micro-batch 0 and
that module, the verdict is reproducible, and `nanscope trace` on the bundle says the NaN started upstream of the
loss."""

import json

import pytest

from nanscope.cli.main import main
from tests.verl import harness, plugin

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("wide_lines"),
]  # the second: trace's lines asserted whole


def test_c_a_layer_faulty_on_every_pass_raises_on_every_rank_with_a_reproducible_report(tmp_path, model, capsys):
    ranks = harness.run(plugin.spec(fault="every", env=plugin.with_reports(tmp_path)), tmp_path, model)
    assert all(plugin.ours(rank) and rank.error is not None for rank in ranks)
    assert "rank 1" in ranks[0].error.lower() or "rank(s) 1" in ranks[0].error, ranks[0].error
    report = json.loads(plugin.report(tmp_path, 1).read_text())
    assert report["first_forward"]["module"] == harness.FAULT_MODULE and report["first_forward"]["microbatch"] == 0
    assert report["rerun"]["verdict"] == "reproducible"
    assert not list((tmp_path / "reports").glob("*rank0.json"))  # rank 0 saw nothing non-finite itself
    bundles = sorted((tmp_path / "reports").glob("*rank1.bundle.pt"))
    assert len(bundles) == 1
    capsys.readouterr()
    assert main(["trace", str(bundles[0])]) == 0
    assert "the NaN started upstream of the loss" in capsys.readouterr().out
