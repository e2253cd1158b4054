"""Issue 43, the KL term: a NaN ref_log_prob at a masked token on rank 1, use_kl_loss=True. verl computes the KL
term in ppo_loss itself, outside any policy loss mode (verl/workers/utils/losses.py:132-141: kl_penalty, then
agg_loss). Under k2 (0.5 * (log_prob - ref)^2, core_algos.py:2233-2234) the NaN's derivative meets the mask's zero
gradient: verl alone gets a NaN grad_norm and skips the step. With the plugin the engine's train_batch replaces the
value and zeroes ref_log_prob at masked tokens (nanscope.verl_plugin.inputs) before ppo_loss runs: the step is
applied, nanscope/nan_guard/ref_log_prob counts it, and the parameters equal, bitwise, verl's own run whose
ref_log_prob at that token was finite (the unplanted data). The same under low_var_kl, whose exponent verl clamps
(core_algos.py:2238-2244)."""

import math

import pytest

from tests.verl import harness, plugin
from tests.verl.harness import Spec

pytestmark = pytest.mark.timeout(600)


def _kl(kl_type: str) -> tuple[str, ...]:
    return ("actor.use_kl_loss=True", f"actor.kl_loss_type={kl_type}", "actor.kl_loss_coef=1.0")


def test_g_verl_alone_skips_the_step_on_a_nan_ref_log_prob_at_a_masked_token_under_k2(tmp_path, model):
    ranks = harness.run(Spec(plants={0: "ref_log_prob_nan_masked"}, overrides=_kl("k2")), tmp_path, model)
    for rank in ranks:
        assert rank.error is None and math.isfinite(rank.driver[0]["actor/kl_loss"])
        assert math.isnan(rank.driver[0]["actor/grad_norm"]) and "WARN: grad_norm is not finite: nan" in rank.output
        assert harness.same(rank.before, rank.after)


@pytest.mark.parametrize("kl_type", ["k2", "low_var_kl"])
def test_g_with_the_plugin_the_step_is_the_finite_ref_log_probs(tmp_path, model, kl_type):
    planted = plugin.spec(plants={0: "ref_log_prob_nan_masked"}, overrides=_kl(kl_type),
                          env=plugin.with_reports(tmp_path))  # fmt: skip
    got = harness.run(planted, tmp_path, model, name="plugin")
    finite = harness.run(Spec(overrides=_kl(kl_type)), tmp_path, model, name="finite")
    for mine, verls in zip(got, finite):
        assert mine.error is None and plugin.ours(mine) and "grad_norm is not finite" not in mine.output
        logged = mine.driver[0]
        assert plugin.finite(logged["actor/grad_norm"]) and logged["actor/nanscope/nan_guard/ref_log_prob"] == 1.0
        assert logged["actor/nanscope/nan_guard/dropped_tokens"] == 0.0  # the token was masked already
        assert logged["actor/kl_loss"] == verls.driver[0]["actor/kl_loss"] != 0.0
        assert harness.same(mine.after, verls.after) and not harness.same(mine.after, mine.before)
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())
