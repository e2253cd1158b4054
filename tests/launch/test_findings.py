"""The findings catalogue: which flags fire which rule, and what is reported as fine."""

import re

from nanscope.launch.config import batches, resolve
from nanscope.launch.findings import PLUGIN, findings, fine

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


def _run(argv, world=64, dp=2, cp=2):
    cfg = resolve(argv)
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
    from nanscope.hazards import BY_NAME

    _, _, found = _run(CASE_FLAGS)
    named = {h for f in found.values() for h in f.hazards}
    assert named == {"kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward"}
    assert named <= set(BY_NAME)


def test_zero_temperature_is_a_critical_finding():
    _, _, found = _run(CASE_FLAGS + ["--rollout-temperature", "0"])
    f = found["zero-rollout-temperature"]
    assert (f.severity, f.flags, f.hazards) == ("critical", ["--rollout-temperature 0"], ["zero-temperature"])
    assert "loss.py:54" in f.mechanism and "zero-rollout-temperature" not in _run(CASE_FLAGS)[2]
