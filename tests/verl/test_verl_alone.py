"""verl 0.9.0 without nanscope, through the harness: what the research notes measured (shared/research/
verl-plugin.md §1), pinned so the harness is proven and the plugin's cases have a baseline to differ from."""

import math

import pytest

from tests.verl import harness
from tests.verl.harness import Spec

pytestmark = pytest.mark.timeout(600)


def test_a_nan_advantage_at_a_masked_token_skips_the_step_on_every_rank_and_the_lr_still_advances(tmp_path, model):
    # fsdp/transformer_impl.py:793-798: a non-finite grad_norm skips optimizer.step() and prints the WARN;
    # engine_workers.py:369-370 steps the LR schedule regardless
    spec = Spec(plants={0: "advantage_nan_masked"}, overrides=harness.COSINE)
    ranks = harness.run(spec, tmp_path, model)
    for rank in ranks:
        assert rank.error is None and rank.engine == "verl.workers.engine.fsdp.transformer_impl.FSDPEngineWithLMHead"
        assert "WARN: grad_norm is not finite: nan" in rank.output
        assert math.isnan(rank.driver[0]["actor/grad_norm"]) and math.isfinite(rank.driver[0]["actor/pg_loss"])
        assert rank.driver[0]["actor/lr"] < 1e-2  # the rate logged after the schedule's step: advanced
        assert harness.same(rank.before, rank.after)


def test_a_nan_old_log_prob_at_a_trained_token_gives_a_nan_loss_and_the_step_is_applied(tmp_path, model):
    # the vanilla ratio clamps log_prob - old_log_prob (core_algos.py:1336-1339): clamp's backward is 0 at a NaN,
    # so the loss is NaN while the gradient stays finite, and verl applies the step (issue #2790's consequence)
    ranks = harness.run(Spec(plants={0: "old_log_prob_nan_trained"}), tmp_path, model)
    for rank in ranks:
        assert rank.error is None and "grad_norm is not finite" not in rank.output
        assert math.isnan(rank.driver[0]["actor/pg_loss"]) and math.isfinite(rank.driver[0]["actor/grad_norm"])
        assert not harness.same(rank.before, rank.after)
    assert harness.same(ranks[0].after, ranks[1].after)  # FSDP2's full parameters: one model on both ranks
