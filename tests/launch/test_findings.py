"""The findings catalogue: which flags fire which rule, and what is reported as fine."""

import re

import pytest

from nanscope.facts.flags import BY_SPELLING
from nanscope.launch.config import batches, resolve
from nanscope.launch.findings import findings, fine
from nanscope.launch.findings.finding import PLUGIN

CASE_FLAGS = [
    "--actor-num-nodes",
    "8",
    "--rollout-num-gpus",
    "64",
    "--colocate",
    "--rollout-batch-size",
    "64",
    "--n-samples-per-prompt",
    "8",
    "--global-batch-size",
    "512",
    "--advantage-estimator",
    "grpo",
    "--use-kl-loss",
    "--kl-loss-coef",
    "0.00",
    "--kl-loss-type",
    "low_var_kl",
    "--entropy-coef",
    "0.00",
    "--eps-clip",
    "0.2",
    "--eps-clip-high",
    "0.28",
    "--use-tis",
    "--context-parallel-size",
    "2",
    "--use-dynamic-batch-size",
    "--max-tokens-per-gpu",
    "16384",
    "--sglang-context-length",
    "65536",
    "--rollout-max-response-len",
    "61440",
    "--group-rm",
    "--custom-generate-function-path",
    "deepresearch.generate.generate",
    "--custom-rm-path",
    "deepresearch.reward.reward_func",
]


def _run(argv, world=64, dp=2, cp=2, release="v0.1.0"):
    cfg = resolve(argv, release=release)
    b = batches(cfg, dp, cp)
    return cfg, b, {f.id: f for f in findings(cfg, b, world, cp)}


def test_case_findings():
    _, _, found = _run(CASE_FLAGS)
    assert list(found) == [
        "kl-loss-exp-then-clamp",
        "tis-unvalidated-rollout-logprobs",
        "custom-reward-grpo-normalisation",
        "masked-tokens-reach-loss",
        "ppo-ratio-exp-then-clamp",
        "nan-check-kills-run",
        "sample-exceeds-microbatch-budget",
    ]
    kl = found["kl-loss-exp-then-clamp"]
    assert (kl.severity, kl.flags, kl.hazards) == (
        "high",
        ["--use-kl-loss", "--kl-loss-coef 0", "--kl-loss-type low_var_kl"],
        ["kl-exp-overflow"],
    )
    assert "88.72" in kl.mechanism and kl.fix.startswith("drop --use-kl-loss") and PLUGIN in kl.fix
    assert found["tis-unvalidated-rollout-logprobs"].hazards == ["nan-rollout-logprob"]
    assert found["custom-reward-grpo-normalisation"].hazards == ["nan-reward"]
    assert found["ppo-ratio-exp-then-clamp"].hazards == ["ratio-exp-overflow"]
    # budget: 16384 x 2 = 32768 < 65536 -> need 65536 / 2 = 32768 per GPU
    assert found["sample-exceeds-microbatch-budget"].fix.startswith("--max-tokens-per-gpu 32768")
    assert found["nan-check-kills-run"].fix.startswith("--no-check-for-nan-in-loss-and-grad")


def test_mechanisms_are_two_sentences():
    _, _, found = _run(CASE_FLAGS + ["--eps-clip-c", "3"])
    assert len(found) == 8
    for f in found.values():
        sentences = re.split(r"(?<=[.])\s+(?=[A-Z-])", f.mechanism.strip())
        assert len(sentences) == 2, (f.id, sentences)
        assert f.flags and f.fix


def test_case_fine():
    cfg, b, _ = _run(CASE_FLAGS)
    lines = fine(cfg, b, 64, True)
    assert "no --eps-clip-c: nothing silently ignored in the PPO clip" in lines
    assert "512 samples per rollout / global batch 512 = 1 optimizer step(s) per rollout" in lines
    assert "rollout GPUs (64) consistent with actor GPUs (64)" in lines


def test_plugin_and_flag_fixes_silence_rules():
    argv = CASE_FLAGS + [
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "nanscope.slime_plugin.policy_loss",
        "--no-check-for-nan-in-loss-and-grad",
        "--max-tokens-per-gpu",
        "32768",
    ]
    _, _, found = _run(argv)
    # the reward function is outside the loss: still reported
    assert list(found) == ["custom-reward-grpo-normalisation"]
    cfg, b, _ = _run(argv)
    assert fine(cfg, b, 64, True)[0].startswith("the loss is nanscope's plugin (nanscope.slime_plugin.policy_loss)")


def test_kl_with_k2_is_fine_and_nonzero_coef_is_medium():
    cfg, b, found = _run(["--use-kl-loss", "--kl-loss-type", "k2", "--rollout-batch-size", "1"], world=8, dp=8, cp=1)
    assert "kl-loss-exp-then-clamp" not in found
    assert "--kl-loss-type k2 has no exp: no KL overflow" in fine(cfg, b, 8, True)
    _, _, found = _run(
        ["--use-kl-loss", "--kl-loss-type", "low_var_kl", "--kl-loss-coef", "0.01", "--rollout-batch-size", "1"],
        world=8,
        dp=8,
        cp=1,
    )
    assert found["kl-loss-exp-then-clamp"].severity == "medium"


def test_eps_clip_c_ignored():
    _, _, found = _run(["--eps-clip-c", "3.0", "--rollout-batch-size", "1"], world=8, dp=8, cp=1)
    f = found["eps-clip-c-ignored"]
    assert (f.severity, f.flags) == ("low", ["--eps-clip-c 3"])


def test_tis_without_custom_generate_is_medium():
    _, _, found = _run(["--use-tis", "--rollout-batch-size", "1"], world=8, dp=8, cp=1)
    assert found["tis-unvalidated-rollout-logprobs"].severity == "medium"
    assert "masked-tokens-reach-loss" not in found


def test_batch_not_multiple_and_disaggregated_without_rollout_gpus():
    _, _, found = _run(
        ["--rollout-batch-size", "3", "--n-samples-per-prompt", "2", "--global-batch-size", "4"], world=8, dp=8, cp=1
    )
    assert found["rollout-not-multiple-of-global-batch"].severity == "critical"  # 6 % 4 = 2
    assert found["rollout-gpus-unset"].severity == "critical"  # no --colocate, no --rollout-num-gpus


def test_rollout_gpus_not_multiple_of_engine():
    _, _, found = _run(
        ["--rollout-num-gpus", "6", "--rollout-num-gpus-per-engine", "4", "--rollout-batch-size", "1"],
        world=8,
        dp=8,
        cp=1,
    )
    assert "6/4" in found["rollout-gpus-per-engine"].mechanism


def test_sft_debug_train_only_needs_no_rollout_gpus():
    _, _, found = _run(
        [
            "--loss-type",
            "sft_loss",
            "--debug-train-only",
            "--use-kl-loss",
            "--kl-loss-type",
            "low_var_kl",
            "--rollout-batch-size",
            "8",
        ],
        world=8,
        dp=8,
        cp=1,
    )
    # sft_loss never computes the KL / ratio terms; --debug-train-only starts no rollout engines
    assert list(found) == ["nan-check-kills-run"]


def test_reward_without_group_normalisation():
    _, _, found = _run(
        ["--custom-rm-path", "m.rm", "--disable-rewards-normalization", "--rollout-batch-size", "1"],
        world=8,
        dp=8,
        cp=1,
    )
    f = found["custom-reward-unchecked"]
    assert f.flags[-1] == "--disable-rewards-normalization" and f.hazards == ["nan-reward"]


def test_hazard_names_are_nanscopes():
    from nanscope.causes.catalogue import BY_NAME

    _, _, found = _run(CASE_FLAGS)
    named = {h for f in found.values() for h in f.hazards}
    assert named == {"kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward"}
    assert named <= set(BY_NAME)


def test_zero_temperature_is_a_critical_finding():
    _, _, found = _run(CASE_FLAGS + ["--rollout-temperature", "0"])
    f = found["zero-rollout-temperature"]
    assert (f.severity, f.flags, f.hazards) == ("critical", ["--rollout-temperature 0"], ["zero-temperature"])
    assert "loss.py:54" in f.mechanism and "zero-rollout-temperature" not in _run(CASE_FLAGS)[2]


# Every rule that reads a release fact fires: zero temperature, the KL term at 0 (unbiased from v0.2.4),
# TIS with mismatch metrics and rollout log-probs as the old policy, a custom reward, dual-clip, a rollout
# of 5 x 8 = 40 samples for a global batch of 32, 6 rollout GPUs for engines of 4, a sample over the budget.
EVERYTHING = [
    "--rollout-temperature", "0", "--use-kl-loss", "--kl-loss-coef", "0", "--kl-loss-type", "low_var_kl",
    "--use-unbiased-kl", "--use-tis", "--get-mismatch-metrics", "--use-rollout-logprobs",
    "--custom-generate-function-path", "g.gen", "--custom-rm-path", "r.rm", "--n-samples-per-prompt", "8",
    "--eps-clip-c", "3", "--rollout-batch-size", "5", "--global-batch-size", "32", "--rollout-num-gpus", "6",
    "--rollout-num-gpus-per-engine", "4", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "100",
    "--rollout-max-prompt-len", "100", "--rollout-max-response-len", "1000",
]  # fmt: skip
RELEASES = ("v0.1.0", "v0.2.4", "v0.3.1", "main")
# Flags fix texts name that launch.config.FLAGS does not model; tests/slime_releases checks each release has them.
UNMODELLED_FIX_FLAGS = {"--save-debug-rollout-data"}
# These two fixes name the script's own flags (to remove) and nanscope's --slime-version, on purpose.
RELEASE_MISMATCH = ("flag-not-in-release", "value-not-in-release")


def fix_flags(release: str) -> set[str]:
    """Every --flag the fixes name when EVERYTHING runs on `release` (the release-mismatch findings aside)."""
    _, _, found = _run(EVERYTHING, 8, 8, 1, release)
    return {m for f in found.values() if f.id not in RELEASE_MISMATCH for m in re.findall(r"--[a-z][a-z0-9-]+", f.fix)}


@pytest.mark.parametrize("release", RELEASES)
def test_fixes_name_only_flags_the_release_defines(release):
    named = fix_flags(release)
    modelled = {f for f in named if f in BY_SPELLING}
    assert named - modelled == UNMODELLED_FIX_FLAGS
    assert {f for f in modelled if not BY_SPELLING[f].defined_at(release)} == set()
    assert ("--use-rollout-logprobs" in named) == (release != "v0.1.0")  # the fix of a rule only later releases have


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_rule_is_two_sentences(release):
    _, _, found = _run(EVERYTHING, 8, 8, 1, release)
    for f in found.values():
        assert len(re.split(r"(?<=[.])\s+(?=[A-Z-])", f.mechanism.strip())) == 2, (release, f.id, f.mechanism)


def test_what_differs_between_releases():
    ids = {r: list(_run(EVERYTHING, 8, 8, 1, r)[2]) for r in RELEASES}
    later = ["kl-loss-exp-then-clamp", "unbiased-kl-ratio-exp", "tis-unvalidated-rollout-logprobs"]
    later += ["rollout-logprobs-as-old-policy", "custom-reward-grpo-normalisation", "masked-tokens-reach-loss"]
    assert ids["v0.1.0"] == [
        "flag-not-in-release",
        "zero-rollout-temperature",
        "rollout-not-multiple-of-global-batch",
        "rollout-gpus-per-engine",
        "kl-loss-exp-then-clamp",
        "tis-unvalidated-rollout-logprobs",
        "custom-reward-grpo-normalisation",
        "masked-tokens-reach-loss",
        "ppo-ratio-exp-then-clamp",
        "nan-check-kills-run",
        "eps-clip-c-ignored",
        "sample-exceeds-microbatch-budget",
    ]
    tail = ["ppo-ratio-exp-then-clamp", "nan-check-kills-run"]
    assert ids["v0.2.4"] == ids["v0.3.1"] == [
        "zero-rollout-temperature", "rollout-gpus-per-engine", *later, *tail, "eps-clip-c-ignored",
        "sample-exceeds-microbatch-budget", "rollout-not-multiple-of-global-batch",
    ]  # fmt: skip
    assert ids["main"] == [
        "zero-rollout-temperature", "rollout-gpus-per-engine", *later, *tail,
        "sample-exceeds-microbatch-budget", "rollout-not-multiple-of-global-batch",
    ]  # fmt: skip


def test_the_rollout_remainder_fails_v0_1_0_and_is_dropped_later():
    found = {r: _run(EVERYTHING, 8, 8, 1, r)[2]["rollout-not-multiple-of-global-batch"] for r in ("v0.1.0", "v0.3.1")}
    assert (found["v0.1.0"].severity, found["v0.1.0"].mechanism) == (
        "critical",
        "slime v0.1.0 asserts rollout-batch-size x n-samples-per-prompt (40) % global-batch-size (32) == 0 at "
        "start-up. The run does not start.",
    )
    assert (found["v0.3.1"].severity, found["v0.3.1"].mechanism) == (
        "low",
        # 5 prompts x 8 samples = 40; 40 % 32 = 8 samples left over
        "slime v0.3.1 trains whole global batches only and drops the rest (slime/utils/dp_schedule.py:135). "
        "Here 40 % 32 = 8 samples of every rollout are generated and never trained.",
    )


def test_dual_clip_is_ignored_until_main():
    cfg, b, found = _run(["--eps-clip-c", "3", "--rollout-batch-size", "1"], 8, 8, 1, "v0.3.1")
    assert found["eps-clip-c-ignored"].title == "--eps-clip-c is accepted but never applied in v0.3.1"
    cfg, b, found = _run(["--eps-clip-c", "3", "--rollout-batch-size", "1"], 8, 8, 1, "main")
    assert "eps-clip-c-ignored" not in found
    assert "--eps-clip-c 3: slime main applies dual-clip PPO (slime/backends/megatron_utils/loss.py:1038-1044)" in fine(
        cfg, b, 8, True
    )


@pytest.mark.parametrize(("release", "line"), [("v0.1.0", 54), ("v0.2.4", 77), ("v0.3.1", 91), ("main", 134)])
def test_zero_temperature_cites_the_release(release, line):
    f = _run(["--rollout-temperature", "0", "--rollout-batch-size", "1"], 8, 8, 1, release)[2][
        "zero-rollout-temperature"
    ]
    assert f.mechanism.startswith(
        f"slime {release} divides the logits by --rollout-temperature in the log-prob pass and in the loss "
        f"(backends/megatron_utils/loss.py:{line}) and never checks that it is positive"
    )


def test_the_kl_default_changes_with_the_release():
    for release, kl in (("v0.1.0", "kl"), ("v0.2.4", "k1")):
        cfg, b, found = _run(["--use-kl-loss", "--rollout-batch-size", "1"], 8, 8, 1, release)
        assert "kl-loss-exp-then-clamp" not in found
        assert (
            f"--kl-loss-type {kl} has no exp: no KL overflow (slime {release}'s default: the KL term's exp hazard "
            "needs --kl-loss-type low_var_kl or k3)"
        ) in fine(cfg, b, 8, True)


def test_flags_and_values_the_release_lacks():
    _, _, found = _run(["--use-rollout-logprobs", "--rollout-batch-size", "1"], 8, 8, 1, "v0.1.0")
    f = found["flag-not-in-release"]
    assert (f.severity, f.flags, f.mechanism, f.fix) == (
        "critical",
        ["--use-rollout-logprobs"],
        "slime v0.1.0's parser does not define --use-rollout-logprobs and refuses unknown arguments "
        "(slime/utils/arguments.py:884 (Megatron's parse_args, unknown arguments are an error)). "
        "The run does not start.",
        "remove it, or run the release that defines it (--use-rollout-logprobs is defined from v0.2.4); if the "
        "script is for another release, pass --slime-version.",
    )
    assert "rollout-logprobs-as-old-policy" not in found  # v0.1.0 has no such route
    _, _, found = _run(["--kl-loss-type", "kl", "--rollout-batch-size", "1"], 8, 8, 1, "v0.2.4")
    f = found["value-not-in-release"]
    assert (f.severity, f.title, f.fix) == (
        "critical",
        "slime v0.2.4 rejects --kl-loss-type kl",
        "one of the accepted values (--kl-loss-type kl is v0.1.0's spelling); if the script is for another "
        "release, pass --slime-version.",
    )
    assert f.mechanism.startswith("slime v0.2.4's parser checks these values against its choices (--kl-loss-type "
                                  "accepts k1, k2, k3, low_var_kl).")  # fmt: skip


def test_a_parser_that_ignores_unknown_flags_says_so():
    cfg = resolve(["--rollout-batch-size", "1"], release="v0.3.1")
    cfg.undefined.append("--use-rollout-logprobs")  # as a flag v0.3.1 lacked would be
    f = {x.id: x for x in findings(cfg, batches(cfg, 8, 1), 8, 1)}["flag-not-in-release"]
    assert (f.severity, f.mechanism) == (
        "medium",
        "slime v0.3.1's parser does not define --use-rollout-logprobs and ignores unknown arguments "
        "(slime/backends/megatron_utils/arguments.py:186 (ignore_unknown_args=True)). They are dropped without a "
        "word: what they turn on stays off.",
    )


def test_routes_of_rollout_log_probs_from_v0_2_4():
    _, _, found = _run(["--get-mismatch-metrics", "--rollout-batch-size", "1"], 8, 8, 1, "v0.2.4")
    tis = found["tis-unvalidated-rollout-logprobs"]
    assert tis.flags[0] == "--get-mismatch-metrics" and tis.fix.endswith("or drop --get-mismatch-metrics.")
    assert tis.mechanism.startswith("--get-mismatch-metrics runs slime v0.2.4's TIS function, which multiplies")
    _, _, found = _run(["--use-rollout-logprobs", "--rollout-batch-size", "1"], 8, 8, 1, "v0.3.1")
    f = found["rollout-logprobs-as-old-policy"]
    assert (f.severity, f.hazards) == ("medium", ["nan-rollout-logprob", "ratio-exp-overflow"])
    _, _, found = _run(
        ["--use-kl-loss", "--use-unbiased-kl", "--kl-loss-coef", "0.1", "--rollout-batch-size", "1"], 8, 8, 1, "main"
    )
    f = found["unbiased-kl-ratio-exp"]
    assert (f.severity, f.flags, f.hazards) == (
        "medium",
        ["--use-kl-loss", "--use-unbiased-kl", "--kl-loss-coef 0.1"],
        ["ratio-exp-overflow"],
    )
    assert "kl-loss-exp-then-clamp" not in found  # k1, main's default: no exp of its own
