"""Issue 43, case D: the fault of case C on the first pass only, NANSCOPE_ON_NONFINITE=skip. The rerun's verdict
is not reproducible, both ranks skip (the parameters unchanged, the learning rate held), and the next step equals,
bitwise, a run with the plugin that never saw the bad batch."""

import json
import math

import pytest

from tests.verl import harness, plugin

pytestmark = pytest.mark.timeout(600)


def test_d_a_transient_fault_is_skipped_everywhere_and_the_next_step_is_a_clean_runs(tmp_path, model):
    env = plugin.with_reports(tmp_path, {"NANSCOPE_ON_NONFINITE": "skip"})
    ranks = harness.run(plugin.spec(fault="first", steps=2, env=env, overrides=harness.COSINE), tmp_path, model,
                        name="skip")  # fmt: skip
    clean = harness.run(plugin.spec(step_offset=1, env=env, overrides=harness.COSINE), tmp_path, model, name="clean")
    assert json.loads(plugin.report(tmp_path, 1).read_text())["rerun"]["verdict"] == "not reproducible"
    for rank, fresh in zip(ranks, clean):
        assert rank.error is None and plugin.ours(rank)
        skipped, next_step = rank.driver
        assert math.isnan(skipped["actor/grad_norm"]) and skipped["actor/nanscope/skipped_steps"] == 1.0
        assert harness.same(rank.steps[0], rank.before)
        assert next_step["actor/lr"] == fresh.driver[0]["actor/lr"]  # the skipped step held the schedule
        assert harness.same(rank.steps[1], fresh.after)
