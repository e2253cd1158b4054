"""Issue 43, case A: a NaN old_log_prob at a trained token on rank 1 (vanilla inner mode). verl alone logs a NaN
pg_loss and applies the step (tests/verl/test_verl_alone.py); with the plugin the loss is finite, the token is
counted as nanscope/nan_guard/old_log_probs, and the parameters equal, bitwise, verl's own run on data where that
token was masked: the token is dropped before verl counts the mini-batch's tokens."""

import pytest

from tests.verl import harness, plugin
from tests.verl.harness import Spec

pytestmark = pytest.mark.timeout(600)


def test_a_nan_old_log_prob_is_dropped_and_counted_and_the_update_is_the_masked_runs(tmp_path, model):
    got = harness.run(plugin.spec(plants={0: "old_log_prob_nan_trained"}, env=plugin.with_reports(tmp_path)),
                      tmp_path, model, name="plugin")  # fmt: skip
    masked = harness.run(Spec(plants={0: "old_log_prob_masked"}), tmp_path, model, name="masked")
    for mine, verls in zip(got, masked):
        assert mine.error is None and plugin.ours(mine)
        logged = mine.driver[0]
        assert plugin.finite(logged["actor/pg_loss"]) and plugin.finite(logged["actor/grad_norm"])
        assert logged["actor/nanscope/nan_guard/old_log_probs"] == 1.0
        assert logged["actor/nanscope/nan_guard/dropped_tokens"] == 1.0  # a trained token, out before verl counts
        assert logged["actor/pg_loss"] == verls.driver[0]["actor/pg_loss"]
        assert harness.same(mine.after, verls.after) and not harness.same(mine.after, mine.before)
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())  # nothing reached the model
