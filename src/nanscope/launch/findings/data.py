"""Rules on the data at the loss's boundary: rollout log-probs, rewards and masked tool tokens that reach
the loss unvalidated (the fix is at their source; the nanscope slime plugin is the backstop).
"""

from __future__ import annotations

from nanscope.causes import catalogue
from nanscope.facts import releases
from nanscope.facts.flags import BY_NAME
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.launch.config import Config
from nanscope.launch.findings.finding import PLUGIN, Finding, slime_policy_loss


def _rollout_source(cfg: Config) -> str:
    custom = cfg["custom_generate_function_path"]
    return f"the custom generate function {custom}" if custom else "SGLang"


def tis(cfg: Config) -> Finding | None:
    # From v0.2.4 --get-mismatch-metrics runs the TIS function too (loss.py:712: `if args.get_mismatch_metrics
    # or args.use_tis`), so its weights multiply pg_loss without --use-tis.
    switches = [name for name in ("use_tis", "get_mismatch_metrics") if cfg.get(name)]
    if not switches or not slime_policy_loss(cfg):
        return None
    custom = cfg["custom_generate_function_path"]
    flags = [BY_NAME[name].spelling for name in switches]
    flags += [cfg.flag_text("custom_generate_function_path")] if custom else []
    flags += [cfg.flag_text("tis_clip"), cfg.flag_text("tis_clip_low")]
    trigger = "TIS" if cfg["use_tis"] else f"--get-mismatch-metrics runs slime {cfg.release}'s TIS function, which"
    mechanism = (
        f"{trigger} multiplies the policy loss by clamp(exp(old_log_prob - rollout_log_prob), "
        f"{cfg['tis_clip_low']:g}, {cfg['tis_clip']:g}), where rollout_log_probs come from {_rollout_source(cfg)} "
        "without validation. The clamp bounds inf but passes NaN (clamp(NaN) = NaN), so one NaN, or a list that "
        "does not line up with the response tokens, makes pg_loss and the gradient of the whole micro-batch NaN."
    )
    fix = (
        "validate rollout_log_probs where they are produced (finite, one per response token, "
        "tool tokens included); find the bad sample with `nanscope scan` on a --save-debug-rollout-data dump; "
        f"the nanscope slime plugin ({PLUGIN}) takes a token with a non-finite log-prob out of the loss "
        "and counts it in nan_guard/*; "
        f"or drop {' and '.join(BY_NAME[name].spelling for name in switches)}."
    )
    return Finding(
        id="tis-unvalidated-rollout-logprobs",
        severity="high" if custom else "medium",
        title="TIS fed by rollout log-probs" + (" from a custom generate function" if custom else ""),
        flags=flags,
        mechanism=mechanism,
        fix=fix,
        hazards=[catalogue.NAN_ROLLOUT_LOGPROB.name],
    )


def rollout_as_old(cfg: Config) -> Finding | None:
    """--use-rollout-logprobs (v0.2.4 on, loss.py:644): the rollout log-probs are the old policy of the ratio."""
    if not cfg.get("use_rollout_logprobs") or not slime_policy_loss(cfg):
        return None
    custom = cfg["custom_generate_function_path"]
    flags = ["--use-rollout-logprobs"] + ([cfg.flag_text("custom_generate_function_path")] if custom else [])
    mechanism = (
        f"--use-rollout-logprobs makes slime {cfg.release}'s policy loss take the rollout log-probs as the old "
        f"policy: ratio = exp(log_prob - rollout_log_prob), with rollout_log_probs from {_rollout_source(cfg)} "
        "unvalidated. One NaN makes the ratio, the loss and the gradient NaN; a list that does not line up with "
        f"the response tokens puts log-ratios past {FP32_EXP_MAX:.2f} into the exp before the clip (inf, then "
        "NaN in the backward), on masked tokens too."
    )
    return Finding(
        id="rollout-logprobs-as-old-policy",
        severity="high" if custom else "medium",
        title="rollout log-probs are the PPO ratio's old policy",
        flags=flags,
        mechanism=mechanism,
        fix="validate rollout_log_probs where they are produced (finite, one per response token, tool tokens "
        "included; `nanscope scan` on a --save-debug-rollout-data dump names the sample); the nanscope slime "
        f"plugin ({PLUGIN}) drops a non-finite log-prob and clamps the log-ratio before exp; or drop "
        "--use-rollout-logprobs (slime recomputes the old log-probs).",
        hazards=[catalogue.NAN_ROLLOUT_LOGPROB.name, catalogue.RATIO_EXP_OVERFLOW.name],
    )


def reward(cfg: Config) -> Finding | None:
    if not cfg["custom_rm_path"]:
        return None
    samples = cfg["n_samples_per_prompt"]
    flags = [cfg.flag_text(name) for name in ("custom_rm_path", "advantage_estimator", "n_samples_per_prompt")]
    if cfg["group_rm"]:
        flags.append("--group-rm")
    group = cfg["advantage_estimator"] in releases.GROUP_NORMALISED and cfg["rewards_normalization"]
    if group:
        std = (
            " and divides by its std (+1e-6)"
            if cfg["grpo_std_normalization"] and cfg["advantage_estimator"] in releases.STD_NORMALISED
            else ""
        )
        mechanism = (
            f"slime subtracts each group's mean reward{std} over the {samples} samples of a prompt, so one NaN or "
            f"inf from the custom reward function makes that group's mean NaN and all {samples} advantages NaN. "
            "Each advantage multiplies every response token of its sample in the policy loss, so the micro-batch "
            "gradient is NaN."
        )
        title = "custom reward feeds GRPO group normalisation"
    else:
        flags.append(
            "--disable-rewards-normalization"
            if not cfg["rewards_normalization"]
            else cfg.flag_text("advantage_estimator")
        )
        mechanism = (
            "Without group normalisation the custom reward goes into the advantage of its own sample, so a NaN or "
            "inf reward makes that sample's advantages non-finite. Each advantage multiplies every response token "
            "of its sample in the policy loss, so the micro-batch gradient is NaN."
        )
        title = "custom reward feeds the advantages unchecked"
    fix = (
        "make the reward function return finite floats (check math.isfinite before returning; map "
        "failures to a fixed reward); `nanscope scan` finds the sample in a rollout dump; as a backstop the "
        f"nanscope slime plugin ({PLUGIN}) drops a sample whose advantage is non-finite and counts it."
    )
    return Finding(
        id="custom-reward-grpo-normalisation" if group else "custom-reward-unchecked",
        severity="high",
        title=title,
        flags=flags,
        mechanism=mechanism,
        fix=fix,
        hazards=[catalogue.NAN_REWARD.name],
    )


def masked(cfg: Config) -> Finding | None:
    if not cfg["custom_generate_function_path"] or not slime_policy_loss(cfg):
        return None
    mechanism = (
        "Multi-turn generate functions append tool outputs to the response with loss_mask 0, but slime "
        "computes log-probs, the ratio, KL and TIS for every response token and applies the mask only in "
        "sum_of_sample_mean as x * loss_mask. A masked token whose value is inf or NaN (e.g. a filler "
        "rollout log-prob) still gives 0 x inf = NaN there, forward and backward."
    )
    fix = (
        f"use the nanscope slime plugin: {PLUGIN} (masks select instead of multiply, so a masked "
        "position reaches neither the sum nor the backward); and give tool tokens finite log-probs in the "
        "generate function."
    )
    return Finding(
        id="masked-tokens-reach-loss",
        severity="high",
        title="multi-turn tool tokens (loss_mask 0) still reach the loss",
        flags=[cfg.flag_text("custom_generate_function_path")],
        mechanism=mechanism,
        fix=fix,
        hazards=[catalogue.NAN_ROLLOUT_LOGPROB.name],
    )
