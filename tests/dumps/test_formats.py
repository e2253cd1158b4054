"""Dump formats of slime v0.1.0, v0.2.4, v0.3.1 and main: told apart by the file's fields, each scanned alike."""

import pytest
import torch

from nanscope import case
from nanscope.dumps import checks, demo, formats, io
from nanscope.facts import releases
from tests.dumps.test_checks import rows, scan_samples

RELEASES = releases.KEYS
V0_1_0_FIELDS = releases.BY_KEY["v0.1.0"].sample_fields
# Sample's fields beyond v0.1.0's: 13 from v0.2.4 (slime/utils/types.py), 6 more from v0.3.1 (main: the same)
ADDED_V0_2_4 = [
    "generate_function_path", "group_index", "multimodal_inputs", "multimodal_train_inputs", "non_generation_time",
    "prefix_cache_info", "remove_sample", "rollout_routed_experts", "session_id", "spec_info", "teacher_log_probs",
    "train_metadata", "weight_versions",
]  # fmt: skip
ADDED_V0_3_1 = sorted(
    ADDED_V0_2_4
    + [
        "apply_chat_template_kwargs",
        "custom_rm_path",
        "multimodal_train_input_id",
        "rollout_id",
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
    ]
)


@pytest.mark.parametrize(
    ("release", "want", "same_as", "added", "dtype"),
    [
        ("v0.1.0", "v0.1.0", ("v0.1.0",), [], "bfloat16"),
        ("v0.2.4", "v0.2.4", ("v0.2.4",), ADDED_V0_2_4, "float32"),
        ("v0.3.1", "v0.3.1", ("v0.3.1", "main"), ADDED_V0_3_1, "float32"),
        ("main", "v0.3.1", ("v0.3.1", "main"), ADDED_V0_3_1, "float32"),
    ],
)
def test_rollout_format_from_the_sample_fields(release, want, same_as, added, dtype):
    f = formats.rollout(demo.rollout_sample(0, 2, 2, release=release))
    assert (f.release, f.same_as, f.fields_added, f.fields_removed, f.rollout_logprob_dtype) == (
        want,
        same_as,
        added,
        [],
        dtype,
    )


def test_a_sample_with_fewer_fields_reads_as_v0_1_0():
    f = formats.rollout({"tokens": [1], "response_length": 1, "reward": 1.0, "rollout_id": 3})
    assert (f.release, f.fields_added) == ("v0.1.0", ["rollout_id"])  # one of v0.3.1's six is not v0.3.1
    assert f.fields_removed == [k for k in V0_1_0_FIELDS if k not in ("tokens", "response_length", "reward")]


def test_train_formats_from_keys_and_dtype():
    base = releases.TRAIN_KEYS_V0_1_0 + ("rollout_log_probs",)
    assert formats.train(base, "bfloat16").release == "v0.1.0"
    assert formats.train(base, "float32").release == "v0.2.4"
    undecided = formats.train(releases.TRAIN_KEYS_V0_1_0, None)
    assert (undecided.release, undecided.same_as) == ("v0.1.0", ("v0.1.0", "v0.2.4"))
    later = formats.train(base + releases.BY_KEY["v0.3.1"].train_keys + ("source_names",), "float32")
    assert (later.release, later.fields_added) == (
        "v0.3.1",
        [
            "global_batch_sizes",
            "micro_batch_indices",
            "num_microbatches",
            "rollout_ids",
            "rollout_mask_sums",
            "source_names",
        ],
    )
    odd = formats.train(base, "float16")
    assert (odd.release, odd.same_as, odd.note) == ("v0.1.0", (), "rollout_log_probs as float16: no release's")


# The demo's planted hazards (dumps/demo.py), found alike in every format. abs_token = prompt 24 + token.
ROLLOUT_ROWS = (
    [("grpo-nonfinite", "nan-reward", i, None, None, None, "nan", True) for i in range(3)]
    + [("nonfinite-reward", "nan-reward", 3, None, None, None, "nan", True)]
    + [("grpo-nonfinite", "nan-reward", i, None, None, None, "nan", True) for i in range(3, 8)]
    + [
        ("nonfinite-rollout-logprob", "nan-rollout-logprob", 9, 17, 41, False, "nan", True),
        ("kl-margin", "kl-exp-overflow", 12, 40, 64, True, "100.0", False),
        ("ratio-margin", "ratio-exp-overflow", 12, 40, 64, True, "100.0", False),
        ("zero-loss-mask", None, 14, None, None, None, "0", True),
    ]
)
TRAIN_ROWS = [
    ("kl-margin", "kl-exp-overflow", 5, 40, 64, True, "95.0", True),
    ("ratio-margin", "ratio-exp-overflow", 5, 40, 64, True, "97.0", False),
    ("tis-margin", None, 7, 3, 27, False, "94.0", True),
    ("nonfinite-rollout-logprob", "nan-rollout-logprob", 9, 17, 41, False, "nan", True),
]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("kind", ["rollout", "train"])
def test_every_format_scans_to_the_same_findings(tmp_path, release, kind):
    demo.write_demo(tmp_path / "d.pt", kind, release=release)
    d = io.load(tmp_path / "d.pt", cp_size=2, tp_size=1) if release == "main" else io.load(tmp_path / "d.pt")
    r = checks.scan(d, case.scan_config())
    assert rows(r) == (ROLLOUT_ROWS if kind == "rollout" else TRAIN_ROWS)
    detected = "v0.3.1" if (release, kind) == ("main", "rollout") else release
    assert (r.dump_kind, r.format.release, r.rollout_id, r.rank) == (kind, detected, 12, 0 if kind == "train" else None)
    assert r.verdict.startswith(f"slime {detected} would produce NaN: yes, via ")


def test_main_train_dump_is_one_dict_per_sample_with_whole_responses(tmp_path):
    # main gathers CP fields back (format_version 2): a --context-parallel-size does not slice them again,
    # as the test above shows with cp_size=2; its per-sample keys differ from v0.1.0's rollout_data keys.
    demo.write_demo(tmp_path / "d.pt", "train", release="main")
    f = checks.scan(io.load(tmp_path / "d.pt"), case.scan_config()).format
    assert (f.release, f.same_as, f.fields_added, f.fields_removed) == (
        "main",
        ("main",),
        ["data_parallel_rank", "rollout_ids", "rollout_mask_sums", "rollout_position", "sample_index"],
        ["raw_reward", "sample_indices"],
    )
    obj = torch.load(tmp_path / "d.pt", weights_only=True)
    assert (obj["format_version"], sorted(obj), len(obj["samples"])) == (
        2,
        ["dp_shards", "format_version", "rank", "raw_reward", "rollout_id", "samples"],
        16,
    )


def test_rollout_log_probs_are_checked_in_the_release_s_dtype(tmp_path, make_samples):
    # -88.74: in fp32 the KL bound 88.74 > 88.72 (exp overflows); v0.1.0 trains with bf16, where it is -88.5
    # (bf16 steps by 0.5 at 88), under the limit.
    for release, hit in (
        ("v0.1.0", []),
        ("v0.2.4", [("kl-margin", "kl-exp-overflow", 1, 2, 6, False, "88.74", False)]),
    ):
        samples = [demo.rollout_sample(i, 4, 8, reward=float(i % 2), release=release) for i in range(8)]
        samples[1]["rollout_log_probs"][2] = -88.74
        r = scan_samples(tmp_path, samples)
        got = [(k, m, s, t, a, x, str(round(float(v), 2)), c) for k, m, s, t, a, x, v, c in rows(r, {"kl-margin"})]
        assert (r.format.release, got) == (release, hit)
    samples[1]["rollout_log_probs"][3] = 1e39  # past fp32's max: inf in float32 too, clamped by TIS
    assert rows(scan_samples(tmp_path, samples), {"nonfinite-rollout-logprob"}) == [
        ("nonfinite-rollout-logprob", None, 1, 3, 7, False, "1e+39", True)
    ]
