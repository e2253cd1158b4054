"""The catalogue of rules from a slime configuration to NaN mechanisms.

Each rule reads the resolved configuration and returns a Finding (or nothing): the flags that are
the evidence, the mechanism in two sentences, and the fix (a flag change where one exists, else the
nanscope slime plugin). The semantics are the release's `policy_loss_function` / `compute_approx_kl` /
`compute_policy_loss` (`Config.release`; what differs between releases is data: `launch.config.FLAGS`
and `nanscope.facts.releases`) and megatron-core 0.15.0rc0's gradient check. A fix names only flags the
release defines (but for the two findings about the release itself, which name the script's flags the
release lacks, and nanscope's --slime-version). Each finding names its hazards by the records in `nanscope.hazards`. The verdict
prose that summarises the findings is rendered in `nanscope.report.doctor`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.causes import catalogue
from nanscope.facts import releases
from nanscope.facts.flags import BY_NAME, BY_SPELLING, SCRIPT
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.launch.config import Batches, Config

PLUGIN = "--loss-type custom_loss --custom-loss-function-path nanscope.slime_plugin.policy_loss"
SEVERITIES = ("critical", "high", "medium", "low", "info")


@dataclass
class Finding:
    """One rule that fired.

    Attributes:
        id: stable kebab-case id.
        severity: one of SEVERITIES.
        title: one line.
        flags: the flags that are the evidence, as written (`--kl-loss-coef 0`).
        mechanism: two sentences: what happens numerically.
        fix: a flag change and/or the nanscope slime plugin.
        hazards: nanscope hazard names this corresponds to.
    """

    id: str
    severity: str
    title: str
    flags: list[str]
    mechanism: str
    fix: str
    hazards: list[str] = field(default_factory=list)


def _uses_plugin(cfg: Config) -> bool:
    return cfg["loss_type"] == "custom_loss" and (cfg["custom_loss_function_path"] or "").startswith("nanscope.")


def _slime_policy_loss(cfg: Config) -> bool:
    """The loss-side rules are about the release's own policy_loss_function."""
    return cfg["loss_type"] == "policy_loss"


def _release(cfg: Config) -> releases.SlimeRelease:
    return releases.BY_KEY[cfg.release]


def _undefined(cfg: Config) -> Finding | None:
    """Modelled flags the script gives that the release's parser does not define."""
    if not cfg.undefined:
        return None
    r = _release(cfg)
    spans = "; ".join(f"{f} is defined from {BY_SPELLING[f].since}" for f in cfg.undefined)
    refused = r.unknown_flags == "refused"
    mechanism = (
        f"slime {r.key}'s parser does not define {', '.join(cfg.undefined)} and "
        + ("refuses unknown arguments" if refused else "ignores unknown arguments")
        + f" ({r.parser_at}). "
        + ("The run does not start." if refused else "They are dropped without a word: what they turn on stays off.")
    )
    return Finding(
        "flag-not-in-release",
        "critical" if refused else "medium",
        f"{'flags' if len(cfg.undefined) > 1 else 'a flag'} slime {r.key} does not define",
        list(cfg.undefined),
        mechanism,
        f"remove {'them' if len(cfg.undefined) > 1 else 'it'}, or run the release that defines "
        f"{'them' if len(cfg.undefined) > 1 else 'it'} ({spans}); if the script is for another release, "
        "pass --slime-version.",
    )


def _rejected(cfg: Config) -> Finding | None:
    """Values the release's parser rejects (argparse choices): the run does not start."""
    if not cfg.rejected:
        return None
    r = _release(cfg)
    flags = [f"{flag} {value}" for flag, value, _ in cfg.rejected]
    why = "; ".join(f"{flag} accepts {', '.join(choices)}" for flag, _, choices in cfg.rejected)
    elsewhere = "; ".join(
        f"{flag} {value} is {', '.join(keys)}'s spelling"
        for flag, value, _ in cfg.rejected
        if (keys := [k for k in releases.KEYS if value in BY_SPELLING[flag].choices_at(k)])
    )
    return Finding(
        "value-not-in-release",
        "critical",
        f"slime {r.key} rejects {', '.join(flags)}",
        flags,
        f"slime {r.key}'s parser checks these values against its choices ({why}). Any other value is an "
        "argparse error: the run does not start.",
        "one of the accepted values" + (f" ({elsewhere})" if elsewhere else "") + "; if the script is for "
        "another release, pass --slime-version.",
    )


def _kl(cfg: Config) -> Finding | None:
    if not cfg["use_kl_loss"] or cfg["kl_loss_type"] not in ("low_var_kl", "k3") or not _slime_policy_loss(cfg):
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
        "kl-loss-exp-then-clamp",
        "high" if zero else "medium",
        f"KL loss ({cfg['kl_loss_type']}) in the graph" + (" at coefficient 0" if zero else ""),
        flags,
        mechanism,
        fix,
        [catalogue.KL_EXP_OVERFLOW.name],
    )


def _ratio(cfg: Config) -> Finding | None:
    if cfg["loss_type"] != "policy_loss":
        return None
    flags = [cfg.flag_text("eps_clip"), cfg.flag_text("eps_clip_high"), f"--loss-type {cfg['loss_type']}"]
    mechanism = (
        "compute_policy_loss takes ratio = exp(old_log_prob - log_prob) first and clamps it to "
        f"[1 - {cfg['eps_clip']:g}, 1 + {cfg['eps_clip_high']:g}] afterwards, so a log-ratio above "
        f"{FP32_EXP_MAX:.2f} gives ratio = inf before any clip. Then max(-ratio x A, -clip(ratio) x A) keeps "
        "inf (or inf x 0 = NaN where the advantage is 0) and the backward sends NaN into the log-probs."
    )
    fix = f"use the nanscope slime plugin: {PLUGIN} (clamps the log-ratio to [-20, 20] before exp)."
    return Finding(
        "ppo-ratio-exp-then-clamp",
        "medium",
        "PPO ratio: exp before clamp",
        flags,
        mechanism,
        fix,
        [catalogue.RATIO_EXP_OVERFLOW.name],
    )


def _rollout_source(cfg: Config) -> str:
    custom = cfg["custom_generate_function_path"]
    return f"the custom generate function {custom}" if custom else "SGLang"


def _tis(cfg: Config) -> Finding | None:
    # From v0.2.4 --get-mismatch-metrics runs the TIS function too (loss.py:712: `if args.get_mismatch_metrics
    # or args.use_tis`), so its weights multiply pg_loss without --use-tis.
    on = [f for f in ("use_tis", "get_mismatch_metrics") if cfg.get(f)]
    if not on or not _slime_policy_loss(cfg):
        return None
    custom = cfg["custom_generate_function_path"]
    flags = [BY_NAME[f].spelling for f in on] + ([cfg.flag_text("custom_generate_function_path")] if custom else [])
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
        f"or drop {' and '.join(BY_NAME[f].spelling for f in on)}."
    )
    return Finding(
        "tis-unvalidated-rollout-logprobs",
        "high" if custom else "medium",
        "TIS fed by rollout log-probs" + (" from a custom generate function" if custom else ""),
        flags,
        mechanism,
        fix,
        [catalogue.NAN_ROLLOUT_LOGPROB.name],
    )


def _rollout_as_old(cfg: Config) -> Finding | None:
    """--use-rollout-logprobs (v0.2.4 on, loss.py:644): the rollout log-probs are the old policy of the ratio."""
    if not cfg.get("use_rollout_logprobs") or not _slime_policy_loss(cfg):
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
        "rollout-logprobs-as-old-policy",
        "high" if custom else "medium",
        "rollout log-probs are the PPO ratio's old policy",
        flags,
        mechanism,
        "validate rollout_log_probs where they are produced (finite, one per response token, tool tokens "
        "included; `nanscope scan` on a --save-debug-rollout-data dump names the sample); the nanscope slime "
        f"plugin ({PLUGIN}) drops a non-finite log-prob and clamps the log-ratio before exp; or drop "
        "--use-rollout-logprobs (slime recomputes the old log-probs).",
        [catalogue.NAN_ROLLOUT_LOGPROB.name, catalogue.RATIO_EXP_OVERFLOW.name],
    )


def _unbiased_kl(cfg: Config) -> Finding | None:
    """--use-unbiased-kl (v0.2.4 on): the KL term times exp(log_prob - old_log_prob), inline, unclamped."""
    if not (cfg["use_kl_loss"] and cfg.get("use_unbiased_kl") and _slime_policy_loss(cfg)):
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
        "unbiased-kl-ratio-exp",
        "high" if zero else "medium",
        "unbiased KL: an unclamped exp of the policy log-ratio in the KL term",
        ["--use-kl-loss", "--use-unbiased-kl", cfg.flag_text("kl_loss_coef")],
        mechanism,
        ("drop --use-kl-loss while --kl-loss-coef is 0; " if zero else "")
        + f"drop --use-unbiased-kl, or use the nanscope slime plugin: {PLUGIN} (clamps that log-ratio before exp).",
        [catalogue.RATIO_EXP_OVERFLOW.name],
    )


def _reward(cfg: Config) -> Finding | None:
    if not cfg["custom_rm_path"]:
        return None
    n = cfg["n_samples_per_prompt"]
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
            f"slime subtracts each group's mean reward{std} over the {n} samples of a prompt, so one NaN or inf "
            f"from the custom reward function makes that group's mean NaN and all {n} advantages NaN. Each "
            "advantage multiplies every response token of its sample in the policy loss, so the micro-batch "
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
        "custom-reward-grpo-normalisation" if group else "custom-reward-unchecked",
        "high",
        title,
        flags,
        mechanism,
        fix,
        [catalogue.NAN_REWARD.name],
    )


def _masked(cfg: Config) -> Finding | None:
    if not cfg["custom_generate_function_path"] or not _slime_policy_loss(cfg):
        return None
    flags = [cfg.flag_text("custom_generate_function_path")]
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
        "masked-tokens-reach-loss",
        "high",
        "multi-turn tool tokens (loss_mask 0) still reach the loss",
        flags,
        mechanism,
        fix,
        [catalogue.NAN_ROLLOUT_LOGPROB.name],
    )


def _temperature(cfg: Config) -> Finding | None:
    if cfg["rollout_temperature"] != 0:
        return None
    mechanism = (
        f"slime {cfg.release} divides the logits by --rollout-temperature in the log-prob pass and in the loss "
        f"({_release(cfg).temperature_at.removeprefix('slime/')}) and never checks that it is positive. Every "
        "logit becomes +-inf, the log-softmax computes inf - inf = NaN, so every log-prob, the loss and every "
        "gradient are NaN."
    )
    return Finding(
        "zero-rollout-temperature",
        "critical",
        "--rollout-temperature 0 divides the logits by 0",
        [cfg.flag_text("rollout_temperature")],
        mechanism,
        "a positive --rollout-temperature (for greedy rollouts keep 1.0 for training and set the "
        "sampling temperature in the generate function); no loss can fix it.",
        [catalogue.ZERO_TEMPERATURE.name],
    )


def _eps_clip_c(cfg: Config) -> Finding | None:
    if cfg["eps_clip_c"] is None or _release(cfg).eps_clip_c_applied:
        return None
    mechanism = (
        f"slime {cfg.release} parses --eps-clip-c but policy_loss_function calls compute_policy_loss without it, "
        "so dual-clip PPO is never applied. Negative-advantage tokens with a large ratio are not bounded "
        "by eps-clip-c x |A| as the flag promises."
    )
    return Finding(
        "eps-clip-c-ignored",
        "low",
        f"--eps-clip-c is accepted but never applied in {cfg.release}",
        [cfg.flag_text("eps_clip_c")],
        mechanism,
        f"remove the flag (it does nothing), or apply dual-clip in a custom loss ({PLUGIN}).",
    )


def _nan_check(cfg: Config) -> Finding | None:
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
        "nan-check-kills-run",
        "medium",
        "a NaN gradient kills the run instead of skipping the step",
        flags,
        mechanism,
        "--no-check-for-nan-in-loss-and-grad to skip non-finite steps (log them; it hides the cause, "
        "so fix the mechanisms above too).",
    )


def _budget(cfg: Config, b: Batches, cp: int) -> Finding | None:
    if b.budget_tokens is None or b.longest_sample is None or b.longest_sample <= b.budget_tokens:
        return None
    flags = [
        cfg.flag_text("max_tokens_per_gpu"),
        f"--context-parallel-size {cp}",
        "--use-dynamic-batch-size",
        b.longest_from,
    ]
    mechanism = (
        f"slime packs micro-batches first-fit up to max-tokens-per-gpu x CP = {b.budget_tokens} tokens, but a "
        f"sample may be {b.longest_sample} tokens ({b.longest_from}); such a sample gets a micro-batch of its "
        "own, over the budget memory was sized for. That is an out-of-memory risk, not a NaN mechanism by "
        "itself, but the longest samples are also the most off-policy ones."
    )
    need = -(-b.longest_sample // cp)
    return Finding(
        "sample-exceeds-microbatch-budget",
        "low",
        "samples can be longer than the micro-batch budget",
        flags,
        mechanism,
        f"--max-tokens-per-gpu {need} (>= longest / CP), or bound the sample: lower "
        "--rollout-max-response-len / --sglang-context-length, set --rollout-max-prompt-len.",
    )


def _batches(cfg: Config, b: Batches) -> Finding | None:
    if b.samples_per_rollout is None or not b.steps_remainder:
        return None
    r = _release(cfg)
    assert_ = r.batch_remainder == "assert"
    mechanism = (
        f"slime {r.key} asserts rollout-batch-size x n-samples-per-prompt ({b.samples_per_rollout}) "
        f"% global-batch-size ({b.global_batch}) == 0 at start-up. The run does not start."
        if assert_
        else f"slime {r.key} trains whole global batches only and drops the rest ({r.batch_remainder_at}). "
        f"Here {b.samples_per_rollout} % {b.global_batch} = {b.steps_remainder} samples of every rollout are "
        "generated and never trained."
    )
    return Finding(
        "rollout-not-multiple-of-global-batch",
        "critical" if assert_ else "low",
        "rollout x n-samples is not a multiple of the global batch",
        [
            cfg.flag_text("rollout_batch_size"),
            cfg.flag_text("n_samples_per_prompt"),
            f"--global-batch-size {b.global_batch}",
        ],
        mechanism,
        "make the global batch a divisor of rollout-batch-size x n-samples-per-prompt.",
    )


def _colocate(cfg: Config, world: int) -> Finding | None:
    per_engine = cfg["rollout_num_gpus_per_engine"]
    rollout = cfg["rollout_num_gpus"]
    if rollout is None and not cfg["colocate"] and not cfg["debug_train_only"]:
        return Finding(
            "rollout-gpus-unset",
            "critical",
            "disaggregated run without --rollout-num-gpus",
            ["(no --colocate)", "(no --rollout-num-gpus)"],
            "Without --colocate the rollout engines need their own GPUs, and slime sizes them from "
            "--rollout-num-gpus. Left unset, the engines cannot be placed.",
            "--rollout-num-gpus N (e.g. 8), or --colocate.",
        )
    if rollout is not None and rollout % per_engine:
        return Finding(
            "rollout-gpus-per-engine",
            "critical",
            "rollout GPUs not a multiple of GPUs per engine",
            [f"--rollout-num-gpus {rollout}", cfg.flag_text("rollout_num_gpus_per_engine")],
            f"slime starts rollout-num-gpus / rollout-num-gpus-per-engine = {rollout}/{per_engine} "
            "SGLang engines. A remainder leaves GPUs without an engine or fails placement.",
            "make --rollout-num-gpus a multiple of --rollout-num-gpus-per-engine.",
        )
    if cfg["colocate"] and "--rollout-num-gpus" in cfg.given and cfg.origin("rollout_num_gpus").startswith("derived"):
        given = cfg.given.get("--rollout-num-gpus", ["?"])[0]
        return Finding(
            "colocate-rollout-gpus-overridden",
            "info",
            "--rollout-num-gpus is overridden by --colocate",
            ["--colocate", f"--rollout-num-gpus {given}"],
            f"With --colocate slime sets rollout-num-gpus to the actor GPUs ({world}). The value given is ignored.",
            "drop --rollout-num-gpus (or set it to the actor GPUs).",
        )
    return None


def findings(cfg: Config, b: Batches, world: int, cp: int) -> list[Finding]:
    """All rules that fire, most severe first (stable within a severity)."""
    rules = [
        _undefined(cfg),
        _rejected(cfg),
        _temperature(cfg),
        _kl(cfg),
        _unbiased_kl(cfg),
        _tis(cfg),
        _rollout_as_old(cfg),
        _reward(cfg),
        _masked(cfg),
        _ratio(cfg),
        _nan_check(cfg),
        _eps_clip_c(cfg),
        _budget(cfg, b, cp),
        _batches(cfg, b),
        _colocate(cfg, world),
    ]
    out = [f for f in rules if f is not None]
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))


def fine(cfg: Config, b: Batches, world: int, colocate_ok: bool) -> list[str]:
    """What was checked and is fine, one line each."""
    out = []
    if _uses_plugin(cfg):
        out.append(
            f"the loss is nanscope's plugin ({cfg['custom_loss_function_path']}): log-ratios clamped before "
            "exp, masks select, non-finite inputs dropped and counted"
        )
    if not cfg["use_kl_loss"]:
        out.append("no KL loss term (--use-kl-loss off): no exp of the reference log-ratio in the graph")
    elif cfg["kl_loss_type"] in ("kl", "k1", "k2"):
        default = cfg.origin("kl_loss_type") != SCRIPT
        out.append(
            f"--kl-loss-type {cfg['kl_loss_type']} has no exp: no KL overflow"
            + (
                f" (slime {cfg.release}'s default: the KL term's exp hazard needs --kl-loss-type low_var_kl or k3)"
                if default
                else ""
            )
        )
    if cfg["use_tis"]:
        out.append(
            f"TIS weight is clamped to [{cfg['tis_clip_low']:g}, {cfg['tis_clip']:g}]: an inf weight "
            "becomes the clip, only NaN passes"
        )
    if cfg["eps_clip_c"] is None:
        out.append("no --eps-clip-c: nothing silently ignored in the PPO clip")
    elif _release(cfg).eps_clip_c_applied:
        out.append(
            f"--eps-clip-c {cfg['eps_clip_c']:g}: slime {cfg.release} applies dual-clip PPO "
            f"({_release(cfg).eps_clip_c_at})"
        )
    if cfg["entropy_coef"] == 0:
        out.append(
            "--entropy-coef 0: the entropy is computed (max-subtracted softmax, stable) and reported but weighted 0"
        )
    if cfg["rollout_temperature"] > 0:
        out.append(f"--rollout-temperature {cfg['rollout_temperature']:g} > 0: logits / T stay finite")
    if b.steps_per_rollout is not None and not b.steps_remainder:
        out.append(
            f"{b.samples_per_rollout} samples per rollout / global batch {b.global_batch} = "
            f"{b.steps_per_rollout} optimizer step(s) per rollout"
        )
    if b.budget_tokens is not None and b.longest_sample is not None and b.longest_sample <= b.budget_tokens:
        out.append(f"longest sample {b.longest_sample} <= micro-batch budget {b.budget_tokens} tokens")
    if colocate_ok:
        rollout = cfg["rollout_num_gpus"]
        out.append(
            f"rollout GPUs ({rollout}) consistent with actor GPUs ({world})"
            if cfg["colocate"]
            else f"disaggregated: {rollout} rollout GPUs + {world} actor GPUs"
        )
    return out
