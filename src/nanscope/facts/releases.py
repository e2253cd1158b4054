"""The slime releases nanscope knows, and what differs between them for `doctor` and `scan`: one table.

Each `SlimeRelease` is data, with the file:line at that release's tag that shows it. Flag defaults and
choices per release stay with the flags (`nanscope.facts.flags`: `since`, `changes`, `choices`); this
table holds what is not a flag default:

    parser        what slime's argument parser does with a flag it does not define
    loss          where the loss divides the logits by --rollout-temperature; whether --eps-clip-c reaches
                  compute_policy_loss; what a rollout that is not a multiple of the global batch does
    dumps         the fields of Sample.to_dict() (rollout dumps), the keys a train dump always has, the
                  dtype the trainer holds rollout_log_probs in, the train dump's layout

    loss_api      what the plugin's guard calls and patches in the release's loss module (`LossApi`): the
                  signatures that identify the release, the exp helpers, the CP slicer

The causes `causes.immune.IMMUNE` lists are immune in every release below (same rules, other lines: clamp_min in
cp_utils, std + 1e-6, grpo_std_normalization off at n-samples-per-prompt 1, the grad-norm check in
train_one_step).

    from nanscope.facts import releases
    releases.get("0.2.4").sample_fields     # a release by any accepted spelling; UserError otherwise
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from nanscope.errors import UserError

V0_1_0, V0_2_4, V0_3_1, MAIN = "v0.1.0", "v0.2.4", "v0.3.1", "main"
MAIN_NAME = "main (2026-08-21, 624b824)"  # main as nanscope knows it: the commit checked
# The release the evidence of every rule cites when it holds in all of them (the case ran it).
SLIME_V0_1_0 = "slime v0.1.0"

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


SLIME_LOSS = "slime.backends.megatron_utils.loss"
SLIME_CP = "slime.backends.megatron_utils.cp_utils"

# How a helper exponentiates its log-ratio argument(s); the guard clamps the log-ratio before the call.
EXP_NEG_FIRST = "exp(-x)"  # helper(x, ...) computes exp(-x)                  (PPO ratio, cispo, as_is's approx_kl)
EXP_FIRST = "exp(x)"  # helper(x, ...) computes exp(x)                        (as_is's tis_weights)
EXP_SECOND_MINUS_FIRST = "exp(b-a)"  # helper(a, b, ...) computes exp(b - a)  (slime's compute_approx_kl)


@dataclass(frozen=True)
class LossApi:
    """What the plugin's guard calls and patches in one loss module (`nanscope.loss.guard`).

    Attributes:
        name: as users know it ("v0.3.1").
        module: the loss module (its policy loss and exp helpers live there).
        entry: the policy loss the guard calls, with slime's custom-loss signature.
        signatures: "module.function" -> parameter names; all must match for the release to be identified.
        clamps: helper in `module` -> how it exponentiates its log-ratio (EXP_*).
        inline_exp: `module` calls `torch.exp` on log-ratios inline; its `torch` global is patched.
        slicer: "module.function" of the CP slicer (slice_log_prob_with_cp), None for nanscope's model.
        slicer_takes_format: the slicer takes (qkv_format, max_token_len) too (v0.2.x).
        rollout_always_read: the loss reads rollout_log_probs whenever the batch has them (a metric
            since v0.2), not only under --use-tis.
        log_prob_helper: the function in `module` the policy loss calls first, from the logits to the current
            policy's per-token log-probs and entropy.
        log_prob_returns: what it returns: "dict" ({"log_probs": [per sample], "entropy": [...]}, v0.1.0),
            "pair" ((empty, that dict), v0.2.4 on) or "tensors" ((log_probs [N], entropy [N]), nanscope's model).
        metrics_logger: "module.function" the release logs train metrics through (`log(args, metrics, step_key)`,
            wandb and TensorBoard), or None where it calls wandb.log itself (v0.1.0 model.py:468).
        rows_recipe: how a micro-batch's samples map to rollout-dump rows (`nanscope.slime_plugin.rows`):
            "strided" (v0.1.0, v0.2.4), "popped" (v0.3.1: the partition is dropped before training), "partition" (main).
        schedule_module: the module whose `get_forward_backward_func` train_one_step calls every step (imported
            there at module level: v0.1.0 model.py:15 and :309, v0.2.4 :20 and :419, v0.3.1 :21 and :641, main :21
            and :647); the plugin's rerun replaces that attribute.
    """

    name: str
    module: str
    entry: str
    signatures: Mapping[str, tuple[str, ...]]
    clamps: Mapping[str, str]
    inline_exp: bool
    slicer: str | None
    slicer_takes_format: bool = False
    rollout_always_read: bool = False
    log_prob_helper: str = "get_log_probs_and_entropy"
    log_prob_returns: str = "pair"
    metrics_logger: str | None = None
    schedule_module: str = "slime.backends.megatron_utils.model"
    rows_recipe: str = "strided"

    def reads(self, args) -> tuple[str, ...]:
        """The per-token batch keys this loss reads under `args`, in check order."""
        rollout = self.rollout_always_read or args.use_tis
        return ("log_probs", "advantages") + ("rollout_log_probs",) * rollout + ("ref_log_probs",) * args.use_kl_loss


def _frozen(d: dict) -> Mapping:
    return MappingProxyType(d)


PPO_PARAMETERS = ("ppo_kl", "advantages", "eps_clip", "eps_clip_high", "eps_clip_c")
CUSTOM_LOSS_PARAMETERS = ("args", "batch", "logits", "sum_of_sample_mean")
_TIS = ("args", "pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "kwargs")
_KL_V1 = ("log_probs", "log_probs_base", "kl_loss_type")
_SLICE = ("log_prob", "total_length", "response_length")

_LOSS_V0_1_0 = LossApi(
    name=V0_1_0,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen(
        {
            f"{SLIME_LOSS}.policy_loss_function": CUSTOM_LOSS_PARAMETERS,
            f"{SLIME_LOSS}.loss_function": ("args", "batch", "num_microbatches", "logits"),
            f"{SLIME_LOSS}.compute_policy_loss": PPO_PARAMETERS,
            f"{SLIME_LOSS}.compute_approx_kl": _KL_V1,
            f"{SLIME_CP}.slice_log_prob_with_cp": _SLICE,
        }
    ),
    clamps=_frozen({"compute_policy_loss": EXP_NEG_FIRST, "compute_approx_kl": EXP_SECOND_MINUS_FIRST}),
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
    log_prob_returns="dict",  # loss.py:107-112 (v0.2.4 on: `return torch.empty((0,)), res`, loss.py:297)
)

_LOSS_V0_2_4 = LossApi(
    name=V0_2_4,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen(
        {
            f"{SLIME_LOSS}.policy_loss_function": CUSTOM_LOSS_PARAMETERS,
            f"{SLIME_LOSS}.loss_function": ("args", "batch", "num_microbatches", "logits"),
            f"{SLIME_LOSS}.compute_policy_loss": PPO_PARAMETERS,
            f"{SLIME_LOSS}.compute_approx_kl": _KL_V1 + ("importance_ratio",),
            f"{SLIME_LOSS}.vanilla_tis_function": _TIS,
            f"{SLIME_LOSS}.icepop_function": _TIS,
            f"{SLIME_CP}.slice_log_prob_with_cp": _SLICE + ("qkv_format", "max_token_len"),
        }
    ),
    clamps=_frozen({"compute_policy_loss": EXP_NEG_FIRST, "compute_approx_kl": EXP_SECOND_MINUS_FIRST}),
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
    slicer_takes_format=True,
    rollout_always_read=True,
    metrics_logger="slime.utils.logging_utils.log",  # slime/utils/logging_utils.py:49
)

_V0_3_SIGNATURES = {
    f"{SLIME_LOSS}.policy_loss_function": CUSTOM_LOSS_PARAMETERS,
    f"{SLIME_LOSS}.loss_function": ("args", "batch", "num_microbatches", "step_global_batch_size", "logits"),
    f"{SLIME_LOSS}.compute_policy_loss": PPO_PARAMETERS,
    f"{SLIME_LOSS}.compute_cispo_loss": ("ppo_kl", "log_probs", "advantages", "eps_clip", "eps_clip_high"),
    f"{SLIME_LOSS}.compute_approx_kl": _KL_V1 + ("importance_ratio",),
    f"{SLIME_LOSS}.vanilla_tis_function": _TIS,
    f"{SLIME_LOSS}.icepop_function": _TIS,
    f"{SLIME_CP}.slice_log_prob_with_cp": _SLICE,
}
_V0_3_CLAMPS = _frozen(
    {
        "compute_policy_loss": EXP_NEG_FIRST,
        "compute_cispo_loss": EXP_NEG_FIRST,
        "compute_approx_kl": EXP_SECOND_MINUS_FIRST,
    }
)

_LOSS_V0_3_1 = LossApi(
    name=V0_3_1,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen(_V0_3_SIGNATURES),
    clamps=_V0_3_CLAMPS,
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
    rollout_always_read=True,
    metrics_logger="slime.utils.logging_utils.log",  # slime/utils/logging_utils.py:45
    rows_recipe="popped",  # slime/utils/data.py:296 pops the partition
)

# main as of 2026-08-21 (624b824): v0.3.1's loss API plus the train-dump log-prob capture; it also
# passes --eps-clip-c to compute_policy_loss (dual-clip), which the guard leaves to slime.
_LOSS_MAIN = LossApi(
    name=MAIN_NAME,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen({**_V0_3_SIGNATURES, f"{SLIME_LOSS}.enable_log_prob_capture": ()}),
    clamps=_V0_3_CLAMPS,
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
    rollout_always_read=True,
    metrics_logger="slime.observability.logging_utils.log",  # slime/observability/logging_utils.py:45
    rows_recipe="partition",  # slime/utils/data.py:304-318 keeps it
)


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
        loss_api: what the plugin's guard calls and patches in the release's loss module.
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
    loss_api: LossApi


RELEASES: tuple[SlimeRelease, ...] = (
    SlimeRelease(
        key=V0_1_0,
        name=V0_1_0,
        spellings=("v0.1.0", "0.1.0"),
        unknown_flags="refused",
        parser_at="slime/utils/arguments.py:884 (Megatron's parse_args, unknown arguments are an error)",
        temperature_at="slime/backends/megatron_utils/loss.py:54",
        eps_clip_c_applied=False,
        eps_clip_c_at="slime/backends/megatron_utils/loss.py:269",
        batch_remainder="assert",
        batch_remainder_at="slime/utils/arguments.py:991",
        sample_fields=_SAMPLE_V0_1_0,
        train_keys=(),
        train_layout="rollout_data",
        rollout_logprob_dtype="bfloat16",
        dtype_at="slime/backends/utils/data.py:148",
        dump_writers="slime/ray/buffer.py:59-68, slime/backends/megatron_utils/actor.py:278-290",
        loss_api=_LOSS_V0_1_0,
    ),
    SlimeRelease(
        key=V0_2_4,
        name=V0_2_4,
        spellings=("v0.2.4", "0.2.4"),
        unknown_flags="ignored",
        parser_at="slime/backends/megatron_utils/arguments.py:113 (ignore_unknown_args=True)",
        temperature_at="slime/backends/megatron_utils/loss.py:77",
        eps_clip_c_applied=False,
        eps_clip_c_at="slime/backends/megatron_utils/loss.py:706",
        batch_remainder="trim",
        batch_remainder_at="slime/ray/rollout.py:599-604",
        sample_fields=_SAMPLE_V0_2_4,
        train_keys=(),
        train_layout="rollout_data",
        rollout_logprob_dtype="float32",
        dtype_at="slime/backends/megatron_utils/actor.py:245",
        dump_writers="slime/ray/rollout.py:637-654, slime/utils/train_dump_utils.py:9-22",
        loss_api=_LOSS_V0_2_4,
    ),
    SlimeRelease(
        key=V0_3_1,
        name=V0_3_1,
        spellings=("v0.3.1", "0.3.1"),
        unknown_flags="ignored",
        parser_at="slime/backends/megatron_utils/arguments.py:186 (ignore_unknown_args=True)",
        temperature_at="slime/backends/megatron_utils/loss.py:91",
        eps_clip_c_applied=False,
        eps_clip_c_at="slime/backends/megatron_utils/loss.py:981",
        batch_remainder="trim",
        batch_remainder_at="slime/utils/dp_schedule.py:135",
        sample_fields=_SAMPLE_V0_3_1,
        train_keys=_TRAIN_V0_3_1,
        train_layout="rollout_data",
        rollout_logprob_dtype="float32",
        dtype_at="slime/ray/rollout.py:44, slime/backends/megatron_utils/actor.py:283",
        dump_writers="slime/ray/rollout.py:666-683, slime/utils/train_dump_utils.py:9-22",
        loss_api=_LOSS_V0_3_1,
    ),
    SlimeRelease(
        key=MAIN,
        name=MAIN_NAME,
        spellings=("main", "624b824"),
        unknown_flags="ignored",
        parser_at="slime/backends/megatron_utils/arguments.py:195 (ignore_unknown_args=True)",
        temperature_at="slime/backends/megatron_utils/loss.py:134",
        eps_clip_c_applied=True,
        eps_clip_c_at="slime/backends/megatron_utils/loss.py:1038-1044",
        batch_remainder="trim",
        batch_remainder_at="slime/utils/dp_schedule.py:135",
        sample_fields=_SAMPLE_V0_3_1,
        train_keys=(),
        train_layout="samples",
        rollout_logprob_dtype="float32",
        dtype_at="slime/observability/rollout_data_utils.py:15, slime/backends/megatron_utils/actor.py:290",
        dump_writers="slime/observability/rollout_data_utils.py:140-152, slime/observability/train_data_utils.py:170-230",
        loss_api=_LOSS_MAIN,
    ),
)
BY_KEY = {r.key: r for r in RELEASES}
# The plugin's loss APIs, newest first: a release whose API extends an older one's is tried before it.
LOSS_APIS: tuple[LossApi, ...] = tuple(r.loss_api for r in reversed(RELEASES))

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
