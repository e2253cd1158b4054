"""A run's trend over a directory of dumps: each rollout's headroom, exact, and the first hazard."""

import math

import pytest

from nanscope import case
from nanscope.dumps import demo, many, trend
from nanscope.dumps.headroom import DumpHeadroom
from nanscope.dumps.many import FileSummary
from nanscope.facts.numerics import FP32_EXP_MAX


def drifting_series(tmp_path, release):
    demo.write_drifting_run(tmp_path, rollouts=6, release=release)
    summaries = many.scan_files(many.find_dumps(tmp_path)[0], case.scan_config(), workers=2)
    return trend.trend(summaries)


@pytest.mark.parametrize("release", ["v0.1.0", pytest.param("main", marks=pytest.mark.slow)])  # main: CI's slow tier
def test_a_drifting_run_s_series_are_exact(tmp_path, release):
    series = drifting_series(tmp_path, release)
    rollouts = series["rollouts"]
    assert [e["rollout_id"] for e in rollouts] == [0, 1, 2, 3, 4, 5]
    train = rollouts[:5]  # rollout 5 has a rollout dump only
    # KL: sample 5's masked token 40 has ref_log_probs -1, log_probs -(1 + 18 i): ref - logp = 18 i; every
    # other token has ref = logp = -0.5 (0)
    assert [e["max_kl_log_ratio"] for e in train] == [0.0, 18.0, 36.0, 54.0, 72.0]
    # PPO bound -log_probs: the largest is that token's 1 + 18 i (the others' 0.5)
    assert [e["max_ppo_log_ratio"] for e in train] == [1.0, 19.0, 37.0, 55.0, 73.0]
    # TIS log_probs - rollout: sample 2's 48 trained tokens, -0.5 - (-0.5 - 0.25 i) = 0.25 i; 0 elsewhere
    assert [e["max_tis_log_ratio"] for e in train] == [0.0, 0.25, 0.5, 0.75, 1.0]
    # gap |log_probs - rollout| over the 16 x 48 = 768 trained tokens: 48 of them 0.25 i, the rest 0
    assert [e["train_rollout_gap_max"] for e in train] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [e["train_rollout_gap_mean"] for e in train] == [i / 64 for i in range(5)]  # 48 * 0.25 i / 768
    # p99: rank 0.99 * 767 = 759.33 lies among the top 48 (sorted positions 720-767), all 0.25 i
    assert [e["train_rollout_gap_p99"] for e in train] == [0.0, 0.25, 0.5, 0.75, 1.0]
    # clamped: the KL token once 18 i > 20 (i >= 2); TIS stays below 20
    assert [e["clamped_tokens"] for e in train] == [0, 0, 1, 1, 1]
    # rollout dumps: -rollout_log_probs, largest at the KL token, 1 + 18 i (91 > 88.72 at rollout 5)
    assert [e["rollout_log_ratio_bound"] for e in rollouts] == [1.0, 19.0, 37.0, 55.0, 73.0, 91.0]
    last = rollouts[5]
    assert [last[m] for m in trend.SERIES[:-1]] == [None] * 7 and (last["train_dumps"], last["rollout_dumps"]) == (0, 1)
    assert [e["would_nan"] for e in rollouts] == ["no"] * 5 + ["possibly"]
    assert series["first_hazard"] == {
        "rollout_id": 5,
        "would_nan": "possibly",
        "mechanisms": ["kl-exp-overflow", "ratio-exp-overflow"],
        "train_dump": False,
    }
    assert series["without_train_dump"] == [5] and series["unplaced"] == []
    assert series["note"].startswith("no train dump for rollout 5: slime writes a rollout's train dump after")
    assert (series["limit"], series["clamp"]) == (FP32_EXP_MAX, 20.0)
    assert rollouts[4]["where"] == {
        "max_kl_log_ratio": f"{tmp_path}/train_data/4_0.pt: sample 5",
        "max_ppo_log_ratio": f"{tmp_path}/train_data/4_0.pt: sample 5",
        "max_tis_log_ratio": f"{tmp_path}/train_data/4_0.pt: sample 2",
        "train_rollout_gap_max": f"{tmp_path}/train_data/4_0.pt: sample 2",
        "rollout_log_ratio_bound": f"{tmp_path}/rollout_data/4.pt: sample 5",
    }


def summary(path, kind, rollout_id=None, would_nan="no", **headroom):
    values = headroom.pop("values", {})
    return FileSummary(
        path,
        kind=kind,
        rollout_id=rollout_id,
        would_nan=would_nan,
        headroom=DumpHeadroom(kind, values=values, samples=dict.fromkeys(values, 0), **headroom),
    )


def test_a_rollout_s_ranks_combine_as_the_plugin_reduces_them():
    ranks = [
        summary("t/7_0.pt", "train", values={"max_kl_log_ratio": 3.0, "train_rollout_gap_max": 1.0},
                gap_sum=3.0, gap_count=10, gap_p99=0.5, clamped_tokens=2),
        summary("t/7_1.pt", "train", values={"max_kl_log_ratio": 5.0, "train_rollout_gap_max": math.nan},
                gap_sum=1.0, gap_count=30, gap_p99=0.7, clamped_tokens=1),
    ]  # fmt: skip
    (entry,) = trend.trend(ranks)["rollouts"]
    assert entry["rollout_id"] == 7  # from the names: the dumps store none here
    assert entry["max_kl_log_ratio"] == 5.0 and math.isnan(entry["train_rollout_gap_max"])  # a NaN wins
    assert entry["train_rollout_gap_mean"] == 4.0 / 40  # over both ranks' trained tokens
    assert (entry["train_rollout_gap_p99"], entry["clamped_tokens"]) == (0.7, 2)  # the largest rank's
    assert entry["max_tis_log_ratio"] is None and entry["rollout_log_ratio_bound"] is None


def test_rollout_ids_from_the_dump_then_the_name():
    cases = [("a/12.pt", None, 12), ("a/12_50.pt", None, 12), ("a/x.pt", 4, 4), ("a/x.pt", 4.0, 4), ("a/x.pt", None, None),
             ("a/3.pt", "<dict>", 3), ("a/3.pt", True, 3),
             # issue 42: no rollout a run reaches, nor digits that are not ASCII
             ("a/3.pt", 10**23, 3), ("a/3.pt", -1, 3), ("a/100000000000000000000000.pt", None, None),
             ("a/\u0665\u0660.pt", None, None)]  # fmt: skip
    got = [trend.rollout_of(FileSummary(path, rollout_id=stored)) for path, stored, _ in cases]
    assert got == [want for _, _, want in cases]


def test_unplaced_and_failed_files_and_a_run_without_train_dumps():
    files = [
        summary("r/1.pt", "rollout", values={"rollout_log_ratio_bound": 2.0}),
        summary("r/notes.pt", "rollout", values={"rollout_log_ratio_bound": 9.0}),
        FileSummary("r/2.pt", error="r/2.pt: unreadable"),
    ]
    series = trend.trend(files)
    assert [e["rollout_id"] for e in series["rollouts"]] == [1] and series["unplaced"] == ["r/notes.pt"]
    assert series["first_hazard"] is None and series["without_train_dump"] == [1]
    assert series["note"].startswith("no train dumps (--save-debug-train-data): every point is a rollout dump's bound")
