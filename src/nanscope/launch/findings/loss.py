"""Rules on the loss's numerics: an exp taken before its clamp, a division by the temperature, a clip
that is never applied, and the gradient check that kills the run.

The semantics are the release's `policy_loss_function` / `compute_approx_kl` / `compute_policy_loss`
(`Config.release`) and megatron-core 0.15.0rc0's gradient check.
"""

from __future__ import annotations

from nanscope.causes import catalogue
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.launch.config import Config
from nanscope.launch.findings.finding import PLUGIN, Finding, release_of, slime_policy_loss


def kl(cfg: Config) -> Finding | None:
    if not cfg["use_kl_loss"] or cfg["kl_loss_type"] not in ("low_var_kl", "k3") or not slime_policy_loss(cfg):
        return None
    zero = cfg["kl_loss_coef"] == 0
    clamp = cfg["kl_loss_type"] == "low_var_kl"
    flags = ["--use-kl-loss", cfg.flag_text("kl_loss_coef"), cfg.flag_text("kl_loss_type")]
    mechanism = (
        f"{cfg['kl_loss_type']} computes exp(ref_log_prob - log_prob) - 1 - (ref_log_prob - log_prob)"
        + (", and clamps to [-10, 10] only after the exp" if clamp else " with no clamp")
        + f": a log-ratio above {FP32_EXP_MAX:.2f} (log of fp32 max) makes the exp inf, and in the backward "
        + (
            "exp's derivative (inf) meets the clamp's zero gradient, 0 x inf = NaN, in the log-prob gradient. "
            if clamp
            else "exp's derivative carries inf into the log-prob gradient. "
        )
        + (
            "With --kl-loss-coef 0 the term adds nothing to the loss value but stays in the graph "
            "(loss + 0 x kl_loss), so 0 x inf = NaN reaches every gradient of the micro-batch."
            if zero
            else "Any token where the policy drifted that far from the reference poisons the step."
        )
    )
    fix = (
        "drop --use-kl-loss: with --kl-loss-coef 0 the term only adds risk (slime then does not compute it); "
        if zero
        else ""
    )
    fix += (
        f"to keep the KL term, use the nanscope slime plugin: {PLUGIN} (clamps the log-ratio to [-20, 20] "
        "before exp, so the term stays finite in the graph)."
    )
    return Finding(
        id="kl-loss-exp-then-clamp",
        severity="high" if zero else "medium",
        title=f"KL loss ({cfg['kl_loss_type']}) in the graph" + (" at coefficient 0" if zero else ""),
        flags=flags,
        mechanism=mechanism,
        fix=fix,
        hazards=[catalogue.KL_EXP_OVERFLOW.name],
    )


def ratio(cfg: Config) -> Finding | None:
    if cfg["loss_type"] != "policy_loss":
        return None
    flags = [cfg.flag_text("eps_clip"), cfg.flag_text("eps_clip_high"), f"--loss-type {cfg['loss_type']}"]
    mechanism = (
        "compute_policy_loss takes ratio = exp(old_log_prob - log_prob) first and clamps it to "
        f"[1 - {cfg['eps_clip']:g}, 1 + {cfg['eps_clip_high']:g}] afterwards, so a log-ratio above "
        f"{FP32_EXP_MAX:.2f} gives ratio = inf before any clip. Then max(-ratio x A, -clip(ratio) x A) keeps "
        "inf (or inf x 0 = NaN where the advantage is 0) and the backward sends NaN into the log-probs."
    )
    return Finding(
        id="ppo-ratio-exp-then-clamp",
        severity="medium",
        title="PPO ratio: exp before clamp",
        flags=flags,
        mechanism=mechanism,
        fix=f"use the nanscope slime plugin: {PLUGIN} (clamps the log-ratio to [-20, 20] before exp).",
        hazards=[catalogue.RATIO_EXP_OVERFLOW.name],
    )


def unbiased_kl(cfg: Config) -> Finding | None:
    """--use-unbiased-kl (v0.2.4 on): the KL term times exp(log_prob - old_log_prob), inline, unclamped."""
    if not (cfg["use_kl_loss"] and cfg.get("use_unbiased_kl") and slime_policy_loss(cfg)):
        return None
    zero = cfg["kl_loss_coef"] == 0
    mechanism = (
        f"--use-unbiased-kl makes slime {cfg.release}'s policy loss multiply the KL term by the importance ratio "
        "torch.exp(log_probs - old_log_probs), computed inline with no clamp, whatever --kl-loss-type: a "
        f"log-ratio above {FP32_EXP_MAX:.2f} makes it inf and the backward NaN. "
        + (
            "With --kl-loss-coef 0 the term stays in the graph (loss + 0 x kl_loss), so the NaN reaches every "
            "gradient of the micro-batch."
            if zero
            else "Any token where the policy moved that far since the log-prob pass poisons the step."
        )
    )
    return Finding(
        id="unbiased-kl-ratio-exp",
        severity="high" if zero else "medium",
        title="unbiased KL: an unclamped exp of the policy log-ratio in the KL term",
        flags=["--use-kl-loss", "--use-unbiased-kl", cfg.flag_text("kl_loss_coef")],
        mechanism=mechanism,
        fix=("drop --use-kl-loss while --kl-loss-coef is 0; " if zero else "")
        + f"drop --use-unbiased-kl, or use the nanscope slime plugin: {PLUGIN} (clamps that log-ratio before exp).",
        hazards=[catalogue.RATIO_EXP_OVERFLOW.name],
    )


def temperature(cfg: Config) -> Finding | None:
    if cfg["rollout_temperature"] != 0:
        return None
    mechanism = (
        f"slime {cfg.release} divides the logits by --rollout-temperature in the log-prob pass and in the loss "
        f"({release_of(cfg).temperature_at.removeprefix('slime/')}) and never checks that it is positive. Every "
        "logit becomes +-inf, the log-softmax computes inf - inf = NaN, so every log-prob, the loss and every "
        "gradient are NaN."
    )
    return Finding(
        id="zero-rollout-temperature",
        severity="critical",
        title="--rollout-temperature 0 divides the logits by 0",
        flags=[cfg.flag_text("rollout_temperature")],
        mechanism=mechanism,
        fix="a positive --rollout-temperature (for greedy rollouts keep 1.0 for training and set the "
        "sampling temperature in the generate function); no loss can fix it.",
        hazards=[catalogue.ZERO_TEMPERATURE.name],
    )


def eps_clip_c(cfg: Config) -> Finding | None:
    if cfg["eps_clip_c"] is None or release_of(cfg).eps_clip_c_applied:
        return None
    mechanism = (
        f"slime {cfg.release} parses --eps-clip-c but policy_loss_function calls compute_policy_loss without it, "
        "so dual-clip PPO is never applied. Negative-advantage tokens with a large ratio are not bounded "
        "by eps-clip-c x |A| as the flag promises."
    )
    return Finding(
        id="eps-clip-c-ignored",
        severity="low",
        title=f"--eps-clip-c is accepted but never applied in {cfg.release}",
        flags=[cfg.flag_text("eps_clip_c")],
        mechanism=mechanism,
        fix=f"remove the flag (it does nothing), or apply dual-clip in a custom loss ({PLUGIN}).",
    )


def nan_check(cfg: Config) -> Finding | None:
    if not cfg["check_for_nan_in_loss_and_grad"]:
        return None
    flags = ["(no --no-check-for-nan-in-loss-and-grad)", "rerun mode: disabled (slime never initialises it)"]
    mechanism = (
        "--check-for-nan-in-loss-and-grad is on by default, so Megatron's DDP checks each gradient bucket's "
        f"local norm before the data-parallel reduce; slime {cfg.release} never initialises the RerunStateMachine, "
        "so its mode is DISABLED and a NaN raises RuntimeError and kills the job. With "
        f"--no-check-for-nan-in-loss-and-grad, slime {cfg.release}'s train_one_step checks the gradient itself and "
        "skips a non-finite optimizer step instead."
    )
    return Finding(
        id="nan-check-kills-run",
        severity="medium",
        title="a NaN gradient kills the run instead of skipping the step",
        flags=flags,
        mechanism=mechanism,
        fix="--no-check-for-nan-in-loss-and-grad to skip non-finite steps (log them; it hides the cause, "
        "so fix the mechanisms above too).",
    )
