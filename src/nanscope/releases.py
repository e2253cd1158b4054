"""The slime releases nanscope knows, and what differs between them for `doctor` and `scan`: one table.

Each `SlimeRelease` is data, with the file:line at that release's tag that shows it. Flag defaults and
choices per release stay with the flags (`launch.config.FLAGS`: `since`, `changes`, `choices`); this
table holds what is not a flag default:

    parser        what slime's argument parser does with a flag it does not define
    loss          where the loss divides the logits by --rollout-temperature; whether --eps-clip-c reaches
                  compute_policy_loss; what a rollout that is not a multiple of the global batch does
    dumps         the fields of Sample.to_dict() (rollout dumps), the keys a train dump always has, the
                  dtype the trainer holds rollout_log_probs in, the train dump's layout

The plugin's runtime records (`nanscope.slime_plugin.releases`) take their names from here. The causes
`hazards.IMMUNE` lists are immune in every release below (same rules, other lines: clamp_min in
cp_utils, std + 1e-6, grpo_std_normalization off at n-samples-per-prompt 1, the grad-norm check in
train_one_step).

    from nanscope import releases
    releases.get("0.2.4").sample_fields     # a release by any accepted spelling; UserError otherwise
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.errors import UserError

V0_1_0, V0_2_4, V0_3_1, MAIN = "v0.1.0", "v0.2.4", "v0.3.1", "main"

_SAMPLE_V0_1_0 = (
    "index", "prompt", "tokens", "response", "response_length", "label", "reward", "loss_mask",
    "rollout_log_probs", "status", "metadata",
)  # fmt: skip
_SAMPLE_V0_2_4 = (
    "group_index", "index", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs", "response",
    "response_length", "label", "reward", "loss_mask", "weight_versions", "rollout_log_probs",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata", "generate_function_path",
    "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info",
)  # fmt: skip
_SAMPLE_V0_3_1 = (
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
    "multimodal_train_input_id", "apply_chat_template_kwargs", "response", "response_length", "label", "reward",
    "loss_mask", "weight_versions", "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata", "generate_function_path",
    "custom_rm_path", "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info",
)  # fmt: skip

# What v0.1.0's actor puts in a train dump's rollout_data on the last pipeline stage (slime/backends/utils/
# data.py:79-152, megatron_utils/model.py:254 log_probs, loss.py:224-225 advantages and returns), and what
# it may (round_number from a buffer, rollout_log_probs from the generate function, ref_log_probs with KL).
TRAIN_KEYS_V0_1_0 = (
    "raw_reward", "tokens", "total_lengths", "response_lengths", "rewards", "truncated", "loss_masks",
    "sample_indices", "log_probs", "advantages", "returns",
)  # fmt: skip
TRAIN_OPTIONAL_V0_1_0 = ("round_number", "rollout_log_probs", "ref_log_probs")
# v0.3.1 always adds these (ray/rollout.py:743 rollout_ids, :777 rollout_mask_sums, :887-889 the schedule).
_TRAIN_V0_3_1 = ("rollout_ids", "rollout_mask_sums", "global_batch_sizes", "num_microbatches", "micro_batch_indices")


@dataclass(frozen=True)
class SlimeRelease:
    """One slime release: what doctor and scan read differently in it (see the module docstring).

    Attributes:
        key: the short spelling, in reports and `--slime-version` ("v0.1.0", ..., "main").
        name: as the plugin names it ("main (2026-08-21, 624b824)").
        spellings: what `--slime-version` and the launch-script detection accept for it (lower case).
        unknown_flags: "refused" (the run does not start) or "ignored" (silently), with `parser_at`.
        temperature_at: where the loss divides the logits by --rollout-temperature.
        eps_clip_c_applied: --eps-clip-c reaches compute_policy_loss (dual-clip PPO), with `eps_clip_c_at`.
        batch_remainder: what a rollout of rollout-batch-size x n-samples-per-prompt samples that the global
            batch does not divide does: "assert" (start-up fails) or "trim" (the remainder is dropped).
        sample_fields: Sample.to_dict()'s keys, in order (a rollout dump's samples).
        train_keys: the rollout_data keys a train dump has beyond v0.1.0's, always.
        train_layout: "rollout_data" (per-key lists, CP-sliced) or "samples" (one dict per sample, CP
            fields restored, `format_version` 2).
        rollout_logprob_dtype: "bfloat16" or "float32": what the trainer holds rollout_log_probs in (TIS,
            train dumps), with `dtype_at`.
        dump_writers: where the rollout and train dumps are written.
    """

    key: str
    name: str
    spellings: tuple[str, ...]
    unknown_flags: str
    parser_at: str
    temperature_at: str
    eps_clip_c_applied: bool
    eps_clip_c_at: str
    batch_remainder: str
    batch_remainder_at: str
    sample_fields: tuple[str, ...]
    train_keys: tuple[str, ...]
    train_layout: str
    rollout_logprob_dtype: str
    dtype_at: str
    dump_writers: str


RELEASES: tuple[SlimeRelease, ...] = (
    SlimeRelease(
        V0_1_0,
        "v0.1.0",
        ("v0.1.0", "0.1.0"),
        "refused",
        "slime/utils/arguments.py:884 (Megatron's parse_args, unknown arguments are an error)",
        "slime/backends/megatron_utils/loss.py:54",
        False,
        "slime/backends/megatron_utils/loss.py:269",
        "assert",
        "slime/utils/arguments.py:991",
        _SAMPLE_V0_1_0,
        (),
        "rollout_data",
        "bfloat16",
        "slime/backends/utils/data.py:148",
        "slime/ray/buffer.py:59-68, slime/backends/megatron_utils/actor.py:278-290",
    ),
    SlimeRelease(
        V0_2_4,
        "v0.2.4",
        ("v0.2.4", "0.2.4"),
        "ignored",
        "slime/backends/megatron_utils/arguments.py:113 (ignore_unknown_args=True)",
        "slime/backends/megatron_utils/loss.py:77",
        False,
        "slime/backends/megatron_utils/loss.py:706",
        "trim",
        "slime/ray/rollout.py:599-604",
        _SAMPLE_V0_2_4,
        (),
        "rollout_data",
        "float32",
        "slime/backends/megatron_utils/actor.py:245",
        "slime/ray/rollout.py:637-654, slime/utils/train_dump_utils.py:9-22",
    ),
    SlimeRelease(
        V0_3_1,
        "v0.3.1",
        ("v0.3.1", "0.3.1"),
        "ignored",
        "slime/backends/megatron_utils/arguments.py:186 (ignore_unknown_args=True)",
        "slime/backends/megatron_utils/loss.py:91",
        False,
        "slime/backends/megatron_utils/loss.py:981",
        "trim",
        "slime/utils/dp_schedule.py:135",
        _SAMPLE_V0_3_1,
        _TRAIN_V0_3_1,
        "rollout_data",
        "float32",
        "slime/ray/rollout.py:44, slime/backends/megatron_utils/actor.py:283",
        "slime/ray/rollout.py:666-683, slime/utils/train_dump_utils.py:9-22",
    ),
    SlimeRelease(
        MAIN,
        "main (2026-08-21, 624b824)",
        ("main", "624b824"),
        "ignored",
        "slime/backends/megatron_utils/arguments.py:195 (ignore_unknown_args=True)",
        "slime/backends/megatron_utils/loss.py:134",
        True,
        "slime/backends/megatron_utils/loss.py:1038-1044",
        "trim",
        "slime/utils/dp_schedule.py:135",
        _SAMPLE_V0_3_1,
        (),
        "samples",
        "float32",
        "slime/observability/rollout_data_utils.py:15, slime/backends/megatron_utils/actor.py:290",
        "slime/observability/rollout_data_utils.py:140-152, slime/observability/train_data_utils.py:170-230",
    ),
)
BY_KEY = {r.key: r for r in RELEASES}

# Advantage estimators whose rewards slime normalises per group (mean; and std + 1e-6), the same in every
# release that accepts the estimator (cispo: v0.3.1 on): v0.1.0 ray/buffer.py:88-97, v0.2.4
# ray/rollout.py `_post_process_rewards`, v0.3.1 and main the same with cispo.
GROUP_NORMALISED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALISED = ("grpo", "gspo", "cispo")
KEYS = tuple(BY_KEY)  # oldest first
DEFAULT = BY_KEY[V0_1_0]  # what doctor assumes when nothing names a release


def index(key: str) -> int:
    """The release's position, oldest first (for `since` and `changes` comparisons)."""
    return KEYS.index(key)


def find(spelling: str) -> SlimeRelease | None:
    """The release `spelling` names (`v0.2.4`, `0.2.4`, `V0.2.4`, `main`, `624b824`), or None."""
    text = spelling.strip().lower()
    return next((r for r in RELEASES if text in r.spellings), None)


def get(spelling: str) -> SlimeRelease:
    """The release `spelling` names; an unknown one is one UserError line listing the known ones."""
    release = find(spelling)
    if release is None:
        raise UserError(f"unknown slime release {spelling[:80]!r} (known: {', '.join(KEYS)})")
    return release
