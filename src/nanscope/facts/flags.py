"""The one table of the flags nanscope models: each flag's default, choices and the slime release it exists from.

slime parses one argparse namespace (Megatron's flags plus its own). Only the fields that matter for
layout and NaN mechanisms are modelled. A slime flag's default and choices are v0.1.0's unless its
`changes` / `choices` say otherwise from a later release on, and it exists from `since`; the releases are
`nanscope.facts.releases`. Reading a launch against the table is `nanscope.launch.config.resolve`.

    from nanscope.facts.flags import BY_NAME
    BY_NAME["kl_loss_type"].default_at("v0.2.4")   # "k1"
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.facts import releases

# Whose default a flag has, and the origin label of a value taken from it (Config.origin).
SLIME = "default (slime v0.1.0)"  # v0.1.0's; `slime_default(key)` names any release's
MEGATRON = "default (megatron core_v0.15.0rc0)"
SCRIPT = "launch script"  # the origin of a value the launch script gave


@dataclass(frozen=True)
class Flag:
    """One modelled flag.

    Attributes:
        name: the namespace field, e.g. `tensor_model_parallel_size`.
        kind: "int" | "float" | "str" | "true" (store_true) | "false" (store_false) | "list" (nargs +, words) |
            "floats" (nargs +, finite numbers).
        default: the value when the flag is absent (slime v0.1.0's, for a slime flag).
        owner: SLIME or MEGATRON (whose default it is).
        flag: the command-line spelling when it is not `--` + name with dashes.
        since: the first slime release that defines it.
        changes: (release, default) from that release on, oldest first.
        choices: (release, the values its parser accepts) from that release on, oldest first; () any.
    """

    name: str
    kind: str
    default: object
    owner: str
    flag: str = ""
    since: str = releases.V0_1_0
    changes: tuple[tuple[str, object], ...] = ()
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def spelling(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def defined_at(self, release: str) -> bool:
        """The release's parser defines the flag (Megatron's flags: every release here)."""
        return releases.index(self.since) <= releases.index(release)

    def default_at(self, release: str) -> object:
        return _latest(self.changes, release, self.default)

    def choices_at(self, release: str) -> tuple[str, ...]:
        return _latest(self.choices, release, ())


def _latest(steps: tuple, release: str, first):
    """The value of the last (from_release, value) step at or before `release`; `first` before any."""
    at = releases.index(release)
    return next((v for r, v in reversed(steps) if releases.index(r) <= at), first)


def slime_default(release: str) -> str:
    """The origin of a slime default at `release` ("default (slime v0.2.4)")."""
    return f"default (slime {release})"


def _f(name, kind, default, owner=SLIME, flag="", **per_release):
    return Flag(name, kind, default, owner, flag, **per_release)


_V1, _V2, _V3 = releases.V0_1_0, releases.V0_2_4, releases.V0_3_1


FLAGS: tuple[Flag, ...] = (
    # cluster (slime)
    _f("actor_num_nodes", "int", 1),
    _f("actor_num_gpus_per_node", "int", 8),
    _f("rollout_num_gpus", "int", None),
    _f("rollout_num_gpus_per_engine", "int", 1),
    _f("colocate", "true", False),
    _f("debug_train_only", "true", False),
    _f("debug_rollout_only", "true", False),
    _f("offload", "true", False),
    # parallelism (Megatron)
    _f("tensor_model_parallel_size", "int", 1, MEGATRON),
    _f("pipeline_model_parallel_size", "int", 1, MEGATRON),
    _f("context_parallel_size", "int", 1, MEGATRON),
    _f("expert_model_parallel_size", "int", 1, MEGATRON),
    _f("expert_tensor_parallel_size", "int", None, MEGATRON),
    _f("decoder_first_pipeline_num_layers", "int", None, MEGATRON),
    _f("decoder_last_pipeline_num_layers", "int", None, MEGATRON),
    _f("num_layers_per_virtual_pipeline_stage", "int", None, MEGATRON),
    _f("num_virtual_stages_per_pipeline_rank", "int", None, MEGATRON),
    _f("pipeline_model_parallel_layout", "str", None, MEGATRON),
    _f("account_for_embedding_in_pipeline_split", "true", False, MEGATRON),
    _f("account_for_loss_in_pipeline_split", "true", False, MEGATRON),
    _f("use_tp_pp_dp_mapping", "true", False, MEGATRON),
    _f("sequence_parallel", "true", False, MEGATRON),
    _f("overlap_grad_reduce", "true", False, MEGATRON),
    # model (Megatron; usually from the model-args file)
    _f("num_layers", "int", None, MEGATRON),
    _f("num_experts", "int", None, MEGATRON),
    _f("moe_router_topk", "int", 2, MEGATRON),
    _f("hidden_size", "int", None, MEGATRON),
    _f("vocab_size", "int", None, MEGATRON),
    # MoE (Megatron; usually from the model-args file): megatron-LM core_v0.15.0rc0 arguments.py lines
    _f("moe_router_load_balancing_type", "list", ("aux_loss",), MEGATRON),  # :2817-2820, nargs +
    _f("moe_aux_loss_coeff", "floats", (0.0,), MEGATRON),  # :2862, nargs +
    _f("moe_z_loss_coeff", "float", None, MEGATRON),  # :2864
    _f("moe_router_score_function", "str", "softmax", MEGATRON, choices=((_V1, ("softmax", "sigmoid")),)),  # :2830
    _f("moe_router_dtype", "str", None, MEGATRON, choices=((_V1, ("fp32", "fp64")),)),  # :2821-2827
    _f("moe_router_fusion", "true", False, MEGATRON),  # :2828
    _f("moe_router_enable_expert_bias", "true", False, MEGATRON),  # :2845
    _f("moe_grouped_gemm", "true", False, MEGATRON),  # :2804
    _f("moe_use_legacy_grouped_gemm", "true", False, MEGATRON),  # :2806
    _f("moe_permute_fusion", "true", False, MEGATRON),  # :2879
    _f(  # :2871-2874
        "moe_token_dispatcher_type", "str", "allgather", MEGATRON, choices=((_V1, ("allgather", "alltoall", "flex")),)
    ),
    _f("transformer_impl", "str", "transformer_engine", MEGATRON, choices=((_V1, ("local", "transformer_engine")),)),
    _f(  # :1996-1999, store_false
        "gradient_accumulation_fusion", "false", True, MEGATRON, flag="--no-gradient-accumulation-fusion"
    ),
    _f("fp16", "true", False, MEGATRON),  # :2275; slime v0.1.0 sets args.bf16 = True whatever it says
    # batches and lengths
    _f("rollout_batch_size", "int", None),
    _f("n_samples_per_prompt", "int", 1),
    _f("global_batch_size", "int", None),
    _f("num_steps_per_rollout", "int", None),
    _f("micro_batch_size", "int", 1, MEGATRON),
    _f("use_dynamic_batch_size", "true", False),
    _f("max_tokens_per_gpu", "int", None),
    _f("rollout_max_prompt_len", "int", None),
    # arguments.py:142 (v0.1.0) 1024; from v0.2.4 (:283) None: unbounded
    _f("rollout_max_response_len", "int", 1024, changes=((_V2, None),)),
    _f("sglang_context_length", "int", None),
    _f("seq_length", "int", None, MEGATRON),
    # loss (slime)
    _f(  # arguments.py:519 (v0.1.0), the same choices in every release here
        "loss_type",
        "str",
        "policy_loss",
        choices=((releases.V0_1_0, ("policy_loss", "sft_loss", "custom_loss")),),
    ),
    _f("custom_loss_function_path", "str", None),
    # arguments.py:835 (v0.1.0), :1316 (v0.2.4), :1456 (v0.3.1), :1468 (main): where the plugin's hook goes
    _f("custom_megatron_before_train_step_hook_path", "str", None),
    _f(  # arguments.py:548 (v0.1.0), :809-815 (v0.2.4: ppo), :932-939 (v0.3.1: cispo), :943-950 (main)
        "advantage_estimator",
        "str",
        "grpo",
        choices=(
            (releases.V0_1_0, ("grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")),
            (_V2, ("grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")),
            (_V3, ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")),
        ),
    ),
    _f("rollout_temperature", "float", 1.0),
    _f("eps_clip", "float", 0.2),
    _f("eps_clip_high", "float", None),
    _f("eps_clip_c", "float", None),
    _f("use_kl_loss", "true", False),
    _f("kl_loss_coef", "float", 0.0),
    _f(  # arguments.py:541-542 (v0.1.0: kl), :802-803 (v0.2.4: k1), :925-926 (v0.3.1), :936-937 (main)
        "kl_loss_type",
        "str",
        "kl",
        changes=((_V2, "k1"),),
        choices=((releases.V0_1_0, ("kl", "k2", "k3", "low_var_kl")), (_V2, ("k1", "k2", "k3", "low_var_kl"))),
    ),
    _f("use_unbiased_kl", "true", False, since=_V2),  # loss.py:780 (v0.2.4): importance ratio exp(logp - old)
    _f("kl_coef", "float", 0.0),
    _f("entropy_coef", "float", 0.0),
    _f("use_tis", "true", False),
    _f("tis_clip", "float", 2.0),
    _f("tis_clip_low", "float", 0.0),
    _f("get_mismatch_metrics", "true", False, since=_V2),  # loss.py:712 (v0.2.4): runs the TIS function too
    _f("use_rollout_logprobs", "true", False, since=_V2),  # loss.py:644 (v0.2.4): rollout log-probs as old
    _f("calculate_per_token_loss", "true", False, MEGATRON),
    _f("rewards_normalization", "false", True, flag="--disable-rewards-normalization"),
    _f("grpo_std_normalization", "false", True, flag="--disable-grpo-std-normalization"),
    # data boundaries (slime)
    _f("rollout_function_path", "str", "slime.rollout.sglang_rollout.generate_rollout"),
    _f("custom_generate_function_path", "str", None),
    _f("custom_rm_path", "str", None),
    _f("group_rm", "true", False),
    _f("rm_type", "str", None),
    _f("rollout_data_postprocess_path", "str", None),
    # NaN checks (Megatron)
    _f("check_for_nan_in_loss_and_grad", "false", True, MEGATRON, flag="--no-check-for-nan-in-loss-and-grad"),
    _f("check_for_large_grads", "true", False, MEGATRON),
    _f("rerun_mode", "str", "validate_results", MEGATRON),
)

BY_NAME = {f.name: f for f in FLAGS}

# Hugging Face config.json names -> Megatron field names, so `--model config.json` works too.
MODEL_ALIASES = {
    "num_hidden_layers": "num_layers",
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "moe_router_topk",
}
BY_SPELLING = {f.spelling: f for f in FLAGS}


def eps_clip_high(eps_clip: float, eps_clip_high: float | None) -> float:
    """slime's rule after parsing: an unset --eps-clip-high is --eps-clip (a symmetric clip)."""
    return eps_clip if eps_clip_high is None else eps_clip_high
