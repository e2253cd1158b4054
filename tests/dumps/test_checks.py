"""The checks: every planted hazard found at its exact sample/token, with slime v0.1.0's mechanism."""

import math

import numpy as np
import pytest
import torch

from nanscope import case, hazards
from nanscope.causes import catalogue
from nanscope.dumps import checks, collector, demo, io, verdict, writers
from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.result import HIST_LO, hazard_count


def rows(result, kinds=None):
    """(kind, mechanism, sample, token, abs_token, masked, value-as-text, certain) of listed hazards."""
    return [
        (h.kind, h.mechanism, h.sample, h.token, h.abs_token, h.masked, repr(h.value), h.certain)
        for h in result.hazards
        if kinds is None or h.kind in kinds
    ]


def scan_samples(tmp_path, samples, cfg=None, **load):
    path = writers.write_rollout_dump(tmp_path / "r.pt", samples)
    return checks.scan(io.load(path, **load), case.scan_config() if cfg is None else cfg)


def test_rollout_demo_every_planted_hazard(tmp_path):
    path = tmp_path / "rollout_data" / "12.pt"
    demo.write_demo(path)
    r = checks.scan(io.load(path), case.scan_config(histograms=True))
    # 16 samples x (prompt 24 + response 64); response positions 32..47 masked. abs_token = 24 + token.
    group0 = [("grpo-nonfinite", "nan-reward", i, None, None, None, "nan", True) for i in range(8)]
    reward = ("nonfinite-reward", "nan-reward", 3, None, None, None, "nan", True)
    assert rows(r) == group0[:3] + [reward] + group0[3:] + [
        ("nonfinite-rollout-logprob", "nan-rollout-logprob", 9, 17, 41, False, "nan", True),
        ("kl-margin", "kl-exp-overflow", 12, 40, 64, True, "100.0", False),
        ("ratio-margin", "ratio-exp-overflow", 12, 40, 64, True, "100.0", False),
        ("zero-loss-mask", None, 14, None, None, None, "0", True),
    ]
    assert r.hazards[0].detail == "group 0: sample 3's reward is nan"
    assert r.verdict == (
        "slime v0.1.0 would produce NaN: yes, via nan-rollout-logprob, nan-reward; "
        "possibly also via kl-exp-overflow, ratio-exp-overflow (bounds only)"
    )
    assert (r.would_nan, r.num_samples, r.response_tokens, r.errors) == ("yes", 16, 16 * 64, [])
    counts = {c.kind: (c.status, c.count) for c in r.checks}
    assert counts["tis-margin"] == ("skipped", 0) and counts["grpo-nonfinite"] == ("ran", 8)
    # The bound histograms hold every response token once: 16 * 64 = 1023 binned + the nan of sample 9;
    # one (100) in bin [100, 101); masked: 16 per sample plus sample 14's other 48.
    h = r.histograms["kl-margin"]
    assert (h.all.sum(), h.nan, h.all[100 - HIST_LO + 1], h.masked.sum()) == (1023, 1, 1, 16 * 16 + 48)


def test_train_demo_every_planted_hazard(tmp_path):
    path = tmp_path / "12_0.pt"
    demo.write_demo(path, kind="train")
    r = checks.scan(io.load(path), case.scan_config())
    assert rows(r) == [
        ("kl-margin", "kl-exp-overflow", 5, 40, 64, True, "95.0", True),  # -2 - (-97)
        ("ratio-margin", "ratio-exp-overflow", 5, 40, 64, True, "97.0", False),  # bound: -(-97)
        ("tis-margin", None, 7, 3, 27, False, "94.0", True),  # -1 - (-95)
        ("nonfinite-rollout-logprob", "nan-rollout-logprob", 9, 17, 41, False, "nan", True),
    ]
    assert r.verdict == (
        "slime v0.1.0 would produce NaN: yes, via kl-exp-overflow, nan-rollout-logprob; "
        "possibly also via ratio-exp-overflow (bounds only)"
    )


def test_clean_dump_is_clean(tmp_path, make_samples):
    r = scan_samples(tmp_path, make_samples(16))
    assert (r.hazards, r.would_nan, r.verdict) == ([], "no", "slime v0.1.0 would produce NaN: no")
    assert hazard_count(r) == 0


def test_kl_threshold_is_the_fp32_exp_limit(tmp_path):
    # FP32_EXP_MAX = 88.7228...: a log-ratio of 88.72 is finite under exp, 88.73 overflows.
    assert math.isfinite(torch.tensor(88.72).exp().item()) and torch.tensor(88.73).exp().item() == math.inf
    data = {
        "tokens": [torch.arange(6)],
        "response_lengths": [3],
        "log_probs": [torch.tensor([-90.0, -90.0, -1.0])],
        "ref_log_probs": [torch.tensor([-1.28, -1.27, -1.0])],
    }
    writers.write_train_dump(tmp_path / "t.pt", data)
    r = checks.scan(io.load(tmp_path / "t.pt"), case.scan_config())
    kl = rows(r, {"kl-margin"})
    assert len(kl) == 1 and kl[0][:6] == ("kl-margin", "kl-exp-overflow", 0, 1, 4, False)
    assert float(kl[0][6]) == pytest.approx(88.73, abs=1e-4)


def test_kl_check_follows_the_flags(tmp_path):
    data = {
        "tokens": [torch.arange(4)],
        "response_lengths": [2],
        "log_probs": [torch.tensor([-100.0, -1.0])],
        "ref_log_probs": [torch.tensor([-1.0, -1.0])],
    }
    writers.write_train_dump(tmp_path / "t.pt", data)
    cases = [({}, 1), ({"kl_loss_type": "k3"}, 1), ({"kl_loss_type": "kl"}, 0), ({"use_kl_loss": False}, 0)]
    for flags, expect in cases:
        r = checks.scan(io.load(tmp_path / "t.pt"), case.scan_config(**flags))
        kl = next(c for c in r.checks if c.kind == "kl-margin")
        assert kl.count == expect and kl.status == ("ran" if expect else "skipped")


def test_group_of_one_is_nan_for_every_sample(tmp_path, make_samples):
    # n_samples_per_prompt 1: torch.std of one element is nan (unbiased), so every advantage is nan.
    r = scan_samples(tmp_path, make_samples(3), case.scan_config(n_samples_per_prompt=1))
    assert rows(r) == [("grpo-nonfinite", "nan-reward", i, None, None, None, "nan", True) for i in range(3)]
    assert r.hazards[0].detail == "group 0: group of 1: std of one element is nan"
    # Without std normalisation (Dr.GRPO) a group of 1 is just 0: clean.
    cfg = case.scan_config(n_samples_per_prompt=1, grpo_std_normalization=False)
    r = scan_samples(tmp_path, make_samples(3), cfg)
    assert r.hazards == []


def test_inf_reward_spreads_to_its_group_only(tmp_path, make_samples):
    samples = make_samples(8)
    samples[6]["reward"] = math.inf
    r = scan_samples(tmp_path, samples, case.scan_config(n_samples_per_prompt=4))
    assert [(h.kind, h.sample) for h in r.hazards] == [("grpo-nonfinite", i) for i in (4, 5)] + [
        ("nonfinite-reward", 6),
        ("grpo-nonfinite", 6),
        ("grpo-nonfinite", 7),
    ]
    assert r.hazards[0].detail == "group 1: sample 6's reward is inf"


def test_groups_that_do_not_reshape_are_an_error(tmp_path, make_samples):
    r = scan_samples(tmp_path, make_samples(13))
    assert r.errors == [
        f"{tmp_path / 'r.pt'}: samples: 13 samples do not form groups of --n-samples-per-prompt 8 "
        "(13 % 8 = 5): slime v0.1.0's reshape(-1, 8) fails"
    ]


def test_length_mismatches_name_field_and_sample(tmp_path, make_samples):
    samples = make_samples(8, prompt=4, response=8)
    samples[2]["loss_mask"] = [1] * 7
    samples[5]["rollout_log_probs"] = [-1.0] * 9
    samples[6]["response_length"] = 13  # > len(tokens) = 12
    r = scan_samples(tmp_path, samples)
    p = tmp_path / "r.pt"
    assert r.errors == [
        f"{p}: loss_mask of sample 2: length 7 != response_length 8",
        f"{p}: rollout_log_probs of sample 5: length 9 != response_length 8",
        f"{p}: response_length of sample 6: response_length 13 > len(tokens) 12",
        f"{p}: loss_mask of sample 6: length 8 != response_length 13",
    ]
    assert [(h.kind, h.sample, h.value) for h in r.hazards] == [
        ("length-mismatch", 2, 7),
        ("length-mismatch", 5, 9),
        ("length-mismatch", 6, 13),
        ("length-mismatch", 6, 8),
    ]


def test_cp_sliced_train_dump_without_cp_flags_hints(tmp_path):
    data = {"tokens": [torch.arange(10)], "response_lengths": [6], "log_probs": [torch.zeros(4)]}
    writers.write_train_dump(tmp_path / "t.pt", data)
    r = checks.scan(io.load(tmp_path / "t.pt"), case.scan_config())
    assert r.errors == [
        f"{tmp_path / 't.pt'}: log_probs of sample 0: length 4 != response_length 6 "
        "(CP-sliced? pass --context-parallel-size and --tensor-model-parallel-size)"
    ]


def test_cp_sliced_hazard_maps_to_its_response_token(tmp_path):
    # total 20, response 12, cp 2, CP rank 0 holds response tokens 8..11 (see test_io). A NaN at local
    # entry 2 is response token 10, abs_token 8 + 10 = 18; the mask there is 0.
    mask = torch.ones(12, dtype=torch.int)
    mask[10] = 0
    lp = torch.full((4,), -1.0)
    lp[2] = math.nan
    data = {"tokens": [torch.arange(20)], "response_lengths": [12], "loss_masks": [mask], "log_probs": [lp]}
    writers.write_train_dump(tmp_path / "t.pt", data, rank=0)
    r = checks.scan(io.load(tmp_path / "t.pt", cp_size=2, tp_size=1), case.scan_config())
    assert rows(r) == [("nonfinite-log-prob", "nan-logprob", 0, 10, 18, True, "nan", True)]


def test_rollout_logprob_is_checked_as_bf16(tmp_path, make_samples):
    # 1e39 is a finite float64 but overflows bf16 (max ~3.39e38), the dtype slime trains with: +inf,
    # which TIS clamps: reported, no NaN mechanism. -inf likewise.
    samples = make_samples(8)
    samples[1]["rollout_log_probs"][2] = 1e39
    samples[1]["rollout_log_probs"][3] = -math.inf
    r = scan_samples(tmp_path, samples)
    assert rows(r, {"nonfinite-rollout-logprob"}) == [
        ("nonfinite-rollout-logprob", None, 1, 2, 6, False, "1e+39", True),
        ("nonfinite-rollout-logprob", None, 1, 3, 7, False, "-inf", True),
    ]
    assert r.would_nan == "possibly"  # -inf rollout log-prob: the KL/ratio bounds are inf


def test_no_tis_means_no_rollout_logprob_mechanism(tmp_path, make_samples):
    samples = make_samples(8)
    samples[0]["rollout_log_probs"][0] = math.nan
    r = scan_samples(tmp_path, samples, case.scan_config(use_tis=False))
    assert rows(r) == [("nonfinite-rollout-logprob", None, 0, 0, 4, False, "nan", True)]
    assert r.verdict == "slime v0.1.0 would produce NaN: no"


def test_response_too_long_and_zero_mask(tmp_path, make_samples):
    samples = make_samples(8, response=8)
    samples[3]["loss_mask"] = [0] * 8
    r = scan_samples(tmp_path, samples, case.scan_config(rollout_max_response_len=7))
    assert [(h.kind, h.sample) for h in r.hazards if h.sample == 3] == [("zero-loss-mask", 3), ("response-too-long", 3)]
    assert sum(h.kind == "response-too-long" for h in r.hazards) == 8


def test_counts_are_exact_when_listing_is_capped(tmp_path, make_samples):
    samples = make_samples(8, response=8)
    samples[0]["rollout_log_probs"] = [math.nan] * 8
    r = scan_samples(tmp_path, samples, case.scan_config(max_listed=3))
    check = next(c for c in r.checks if c.kind == "nonfinite-rollout-logprob")
    assert (check.count, check.listed) == (8, 3)
    assert [h.token for h in r.hazards] == [0, 1, 2]
    assert r.per_sample[0, list(checks.KINDS).index("nonfinite-rollout-logprob")] == 8


@pytest.mark.parametrize("name", [h.name for h in catalogue.CATALOGUE])
def test_catalogue_batches_as_train_dumps(tmp_path, name):
    """Each of nanscope's catalogue hazards, dumped as slime would, is found at its site by scan.

    ratio-exp-overflow is found as kl-margin: a dump holds the log-prob pass's logp (old) but not the
    training forward's; ref - old > 88.72 overflows low_var_kl when the training logp equals old, and
    the ratio when it equals ref, so the site is right and the mechanism is one of the two.
    """
    policy = hazards.synthetic_policy(512, 0)
    b = hazards.build(name, policy, case.rollout(512, 0), 0)
    data = {k: b[k] for k in ("total_lengths", "response_lengths", "log_probs", "ref_log_probs", "advantages")}
    data["tokens"] = b["unconcat_tokens"]
    data["loss_masks"] = [m.int() for m in b["loss_masks"]]
    data["rollout_log_probs"] = [x.to(torch.bfloat16) for x in b["rollout_log_probs"]]
    data["rewards"] = [float(a[0]) for a in b["advantages"]]
    writers.write_train_dump(tmp_path / "t.pt", data)
    r = checks.scan(io.load(tmp_path / "t.pt"), case.scan_config())
    site = b["hazard_site"]
    expect = {
        "healthy": [],
        "kl-exp-overflow": ["kl-exp-overflow"],
        "ratio-exp-overflow": ["kl-exp-overflow"],
        "nan-rollout-logprob": ["nan-rollout-logprob"],
        "nan-reward": ["nan-reward"],
        "zero-temperature": ["nan-logprob"],
        "rollout-logprob-shift": [],
        "activation-overflow": [],
        "backward-only-fault": [],
        "transient-fault": [],
        "logprob-drift": ["kl-exp-overflow"],  # at the step it crosses (progress 1)
        "moe-aux-loss": [],
        "moe-zero-token-expert": [],
        "moe-router-logits": [],
    }[name]  # model faults: a healthy batch
    certain = [m for m in r.mechanisms if any(h.mechanism == m and h.certain for h in r.hazards)]
    assert certain == expect
    shifted = [h.sample for h in r.hazards if h.kind == "logprob-mismatch"]
    assert shifted == (list(range(8)) if name == "rollout-logprob-shift" else [])
    assert ("rollout-logprob-shift" in r.verdict) == (name == "rollout-logprob-shift")
    if name in ("kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob"):
        hit = next(h for h in r.hazards if h.mechanism == expect[0])
        assert (hit.sample, hit.token, hit.masked) == (site[0], site[1], True)
    if name == "nan-reward":
        assert sorted({h.sample for h in r.hazards if h.kind == "nonfinite-reward"}) == list(range(8))


def test_bf16_rounding_matches_torch():
    # slime builds rollout_log_probs with torch.tensor(list, dtype=bfloat16); the checks round the same way.
    from nanscope.dumps.sample_checks import bf16

    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.normal(0, 50, 5000),
            -rng.exponential(30, 5000),
            [math.nan, math.inf, -math.inf, 1e39, -1e39, 3.3895313892515355e38, 0.0, -0.0, 1e-45, -88.75],
        ]
    )
    want = torch.tensor(x.tolist(), dtype=torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(bf16(x), want)
    # bf16 keeps 8 significant bits, a step of 0.5 in [64, 128): -88.7 -> -88.5; -88.75 is halfway between
    # -88.5 (mantissa 0110001, odd) and -89.0 (0110010, even) and rounds to even: -89.0.
    assert bf16(np.array([-88.7, -88.75])).tolist() == [-88.5, -89.0]


def test_histogram_bins():
    # Bin 0: < -40 (and -inf); bin b: [-41 + b, -40 + b); last bin 161: >= 120 (and +inf); nan apart.
    col = collector.Collector(case.scan_config(histograms=True), looks_at={"k": "label"})
    x = np.array(
        [-1e9, -41.0, -40.5, -math.inf, -40.0, -0.5, 0.0, 0.99, 88.72, 88.73, 119.9, 120.0, math.inf, math.nan],
        np.float32,
    )
    masked = np.zeros(x.size, bool)
    masked[8] = True
    col.histogram("k", x, masked)
    h = col.hist["k"]
    nz = np.flatnonzero(h.all)
    assert dict(zip(nz.tolist(), h.all[nz].tolist())) == {0: 4, 1: 1, 40: 1, 41: 2, 129: 2, 160: 1, 161: 2}
    assert np.flatnonzero(h.masked).tolist() == [129] and h.nan == 1


@pytest.mark.parametrize("key", ["log_probs", "ref_log_probs", "rollout_log_probs"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_verdict_agrees_with_slime_loss_model(tmp_path, key, value):
    """One non-finite value on a masked token: scan says "yes" exactly when nanscope's model of slime
    v0.1.0's loss (loss.as_is) gives a non-finite loss or gradient. E.g. +-inf rollout log-probs are
    clamped by TIS (finite), -inf ref log-probs make low_var_kl's exp 0 (finite), +inf ref overflows it."""
    from nanscope.loss import as_is

    policy = hazards.synthetic_policy(512, 0)
    b = hazards.build("healthy", policy, case.rollout(512, 0), 0)
    j = int((b["loss_masks"][0] == 0).nonzero()[0])
    b[key][0][j] = value
    logits = hazards.packed_logits(policy, b["unconcat_tokens"]).requires_grad_(True)
    loss, _, _ = as_is.loss_function(case.args(global_batch_size=len(b["response_lengths"])), b, 1, logits)
    loss.backward()
    nan_in_slime = not (torch.isfinite(loss) and torch.isfinite(logits.grad).all())

    data = {k: b[k] for k in ("total_lengths", "response_lengths", "log_probs", "ref_log_probs", "advantages")}
    data.update(
        tokens=b["unconcat_tokens"],
        loss_masks=[m.int() for m in b["loss_masks"]],
        rollout_log_probs=[x.to(torch.bfloat16) for x in b["rollout_log_probs"]],
        rewards=[float(a[0]) for a in b["advantages"]],
    )
    writers.write_train_dump(tmp_path / "t.pt", data)
    r = checks.scan(io.load(tmp_path / "t.pt"), case.scan_config())
    assert (r.would_nan == "yes") == nan_in_slime
    assert any(h.sample == 0 and h.token == j and h.masked for h in r.hazards)  # the site is listed either way


def test_config_for_case_reads_the_case():

    cfg, flags = case.scan_config(), case.loss_flags()
    assert (cfg.n_samples_per_prompt, cfg.advantage_estimator, cfg.use_kl_loss, cfg.kl_loss_type, cfg.use_tis) == (
        flags["n_samples_per_prompt"],
        flags["advantage_estimator"],
        flags["use_kl_loss"],
        flags["kl_loss_type"],
        flags["use_tis"],
    )
    assert (cfg.rollout_max_response_len, cfg.rewards_normalization, cfg.grpo_std_normalization) == (61440, True, True)
    assert case.scan_config(use_tis=False, max_listed=3) == ScanFlags(
        **{**vars(cfg), "use_tis": False, "max_listed": 3}
    )


def test_mechanisms_are_catalogue_names_plus_scan_own():
    assert verdict.MECHANISMS[:4] == tuple(
        h.name
        for h in (
            catalogue.KL_EXP_OVERFLOW,
            catalogue.RATIO_EXP_OVERFLOW,
            catalogue.NAN_ROLLOUT_LOGPROB,
            catalogue.NAN_REWARD,
        )
    )
    assert verdict.MECHANISMS[4] == verdict.NAN_LOGPROB not in catalogue.BY_NAME


def test_every_check_is_one_record_in_report_order(tmp_path):
    demo.write_demo(tmp_path / "12.pt")
    r = checks.scan(io.load(tmp_path / "12.pt"), case.scan_config())
    assert [c.kind for c in r.checks] == [c.kind for c in checks.CHECKS] == list(checks.KINDS)
    assert len(set(checks.KINDS)) == len(checks.KINDS) and [c for c in checks.CHECKS if c.gate] == [
        checks.BY_KIND["length-mismatch"]
    ]
    notes = {c.kind: (c.status, c.note) for c in r.checks}
    assert notes["tis-margin"] == ("skipped", "rollout dump: no old log-probs")
    assert notes["kl-margin"] == ("ran", "bound -rollout_log_probs (ref_logp <= 0)")
    assert notes["nonfinite-log-prob"] == ("skipped", "no log_probs in this dump")
