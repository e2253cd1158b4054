"""Issue 43, case B: under clip_cov (whose exp is not clamped, core_algos.py:1796-1797) a masked token with a
log-ratio of about 95 > 88.72 on rank 1. verl alone gets a NaN grad_norm and skips the step; with the plugin
(loss_mode nanscope over NANSCOPE_INNER_LOSS_MODE=clip_cov) the grad_norm is finite, the headroom maximum reaches
verl's metrics as actor/nanscope/max_ppo_log_ratio (MAX over ranks), a warning line says so, and the parameters
equal those of verl's clip_cov run without the plant."""

import math

import pytest

from tests.verl import harness, plugin
from tests.verl.harness import Spec

pytestmark = pytest.mark.timeout(600)


def test_b_a_masked_log_ratio_of_95_under_clip_cov_is_clamped_logged_and_warned(tmp_path, model):
    env = plugin.with_reports(tmp_path, {"NANSCOPE_INNER_LOSS_MODE": "clip_cov"})
    got = harness.run(plugin.spec(plants={0: "log_ratio_95_masked"}, env=env), tmp_path, model, name="plugin")
    unplanted = harness.run(Spec(loss_mode="clip_cov"), tmp_path, model, name="unplanted")
    warned = [line for rank in got for line in rank.output.splitlines() if line.startswith("nanscope: warning:")]
    assert any("95." in line for line in warned), warned
    for mine, verls in zip(got, unplanted):
        assert mine.error is None and plugin.ours(mine)
        logged = mine.driver[0]
        assert plugin.finite(logged["actor/grad_norm"]) and "grad_norm is not finite" not in mine.output
        assert 94 < logged["actor/nanscope/max_ppo_log_ratio"] < 96
        assert logged["actor/nanscope/nan_guard/exp_overflow"] == 1.0  # the one masked token past 88.72
        assert harness.same(mine.after, verls.after)


def test_b_verl_alone_skips_that_step_with_a_nan_grad_norm(tmp_path, model):
    ranks = harness.run(Spec(loss_mode="clip_cov", plants={0: "log_ratio_95_masked"}), tmp_path, model)
    for rank in ranks:
        assert math.isnan(rank.driver[0]["actor/grad_norm"]) and "WARN: grad_norm is not finite: nan" in rank.output
        assert harness.same(rank.before, rank.after)
