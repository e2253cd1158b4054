"""The early warning: one line per threshold a step's headroom crosses, naming the metric, value and sample."""

import pytest

from nanscope.slime_plugin import logs
from nanscope.slime_plugin.settings import Settings

WHERE = {"rank": 2, "microbatch": 0, "sample": 3}


def test_each_threshold_and_where():
    metrics = {
        "nanscope/max_kl_log_ratio": 71.5,  # past 60: within 88.72 - 71.5 = 17.2 of fp32's overflow
        "nanscope/max_ppo_log_ratio": 25.0,  # past 20 only
        "nanscope/max_tis_log_ratio": 3.0,  # under both
        "nanscope/train_rollout_gap_max": 6.5,  # past the default NANSCOPE_WARN_GAP=5
        "nanscope/nonfinite_inputs": 2.0,
    }
    places = {"nanscope/max_kl_log_ratio": WHERE, "nanscope/train_rollout_gap_max": WHERE}
    assert [text for _, text in logs.warnings_for(metrics, places, Settings())] == [
        "nanscope/max_kl_log_ratio = 71.5 > 60: within 17.2 of fp32's exp overflow at 88.72 (KL log-ratio ref - logp), "
        "at rank 2, micro-batch 0, sample 3",
        "nanscope/max_ppo_log_ratio = 25 > 20 (the plugin's loss clamps log-ratios at ±20) (PPO log-ratio logp - old)",
        "nanscope/train_rollout_gap_max = 6.5 > NANSCOPE_WARN_GAP=5, at rank 2, micro-batch 0, sample 3",
        "2 non-finite loss input entries (log-probs or advantages)",
    ]


def test_a_log_ratio_past_the_overflow_says_by_how_much_not_a_negative_distance():
    # the step the drift kills: exp(146.1) is inf in fp32, 146.1 - 88.72 = 57.4 past it
    ((_, text),) = logs.warnings_for(
        {"nanscope/max_kl_log_ratio": 146.1}, {"nanscope/max_kl_log_ratio": WHERE}, Settings()
    )
    assert text == (
        "nanscope/max_kl_log_ratio = 146.1 > 60: past fp32's exp overflow at 88.72 by 57.4 (KL log-ratio ref - logp), "
        "at rank 2, micro-batch 0, sample 3"
    )


def test_a_nan_maximum_warns_and_nothing_measured_does_not():
    assert logs.warnings_for({"nanscope/max_kl_log_ratio": float("nan")}, {}, Settings()) == [
        ("nanscope/max_kl_log_ratio is NaN", "nanscope/max_kl_log_ratio is NaN (KL log-ratio ref - logp)")
    ]
    assert (
        logs.warnings_for({"nanscope/max_kl_log_ratio": None, "nanscope/train_rollout_gap_max": None}, {}, Settings())
        == []
    )


def test_the_thresholds_are_settings():
    s = Settings.from_env({"NANSCOPE_WARN_GAP": "0.5", "NANSCOPE_WARN_LOG_RATIO": "10,30"})
    assert (s.warn_gap, s.warn_log_ratio) == (0.5, (10.0, 30.0))
    title, text = logs.warnings_for({"nanscope/max_ppo_log_ratio": 12.0}, {}, s)[0]
    assert title == "nanscope/max_ppo_log_ratio > 10" and text.startswith("nanscope/max_ppo_log_ratio = 12 > 10 ")


@pytest.mark.parametrize("value", ["30,10", "20", "20,x", "\u0662\u0660,60", "-1,5"])
def test_bad_thresholds_are_one_line(value):
    with pytest.raises(ValueError) as e:
        Settings.from_env({"NANSCOPE_WARN_LOG_RATIO": value})
    assert str(e.value) == f"NANSCOPE_WARN_LOG_RATIO={value!r}: expected 2 ascending number(s) like 20,60"


def test_train_step_is_slimes():
    from types import SimpleNamespace

    args = SimpleNamespace(rollout_batch_size=64, n_samples_per_prompt=8, global_batch_size=256)
    assert logs.train_step(args, rollout_id=3, step_id=1) == 3 * 2 + 1
