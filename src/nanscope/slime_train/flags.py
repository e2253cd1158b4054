"""The launch of slime's train.py on CPU: the case's own flags, each one kept, resized, dropped or added, with why.

The case's launch.sh (read by `nanscope.case` at the top and passed down here as `{flag: [values]}`) is the
starting point. The tiny model replaces the case's model args (its model-args file was never shared); the world
shrinks to 4 ranks on one node; what cannot run on CPU is dropped; the rest is kept as the case wrote it, the
GRPO, loss, recompute and batching flags above all. `launch(case_flags, paths)` returns the argv and the record of
every change, which the run prints.

    plan = flags.launch(case.config().given, flags.Paths(...))
    plan.argv          # ['--actor-num-nodes', '1', ...]
    plan.dropped       # (('--colocate', 'turns on --offload: ...'), ...)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nanscope.megatron.sizes import TinyQwen3MoE

INIT_HOOK = "nanscope.slime_train.spec.use_spec"  # sets args.spec in each actor (spec.py says why not --spec)
WORLD = 4  # ranks: 1 node x 4 logical GPUs
ROUTER = ("127.0.0.1", "30000")  # --sglang-router-ip/port: set, so slime starts no router (ray/rollout.py:115)

# Flags the CPU cannot run, and why (each names the call or kernel).
CPU_IMPOSSIBLE = {
    "--colocate": "turns on --offload (utils/arguments.py:970-972): torch_memory_saver's CUDA allocator hook "
    "(LD_PRELOAD, actor_group.py:64-74; actor.py:146 pause, :162 resume)",
    "--optimizer-cpu-offload": "megatron's HybridDeviceOptimizer moves fp32 master weights between GPU and host "
    "(optimizer/cpu_offloading/hybrid_optimizer.py)",
    "--overlap-cpu-optimizer-d2h-h2d": "CUDA streams overlapping the offloaded optimizer's copies (with "
    "--optimizer-cpu-offload)",
    "--use-precision-aware-optimizer": "TransformerEngine's FusedAdam (optimizer/__init__.py: "
    "transformer_engine.pytorch.optimizers.FusedAdam)",
    "--attention-backend": "FlashAttention through TransformerEngine; on CPU the local spec's attention "
    "(VarlenDotProductAttention for slime's THD micro-batches, nanscope/megatron/varlen.py)",
}
# MODEL_ARGS flags the case's model-args file sets for Qwen3-235B-A22B (slime's scripts/models/qwen3-235B-A22B.sh)
# that cannot run on CPU; the tiny model's args leave them out.
MODEL_CPU_IMPOSSIBLE = {
    "--moe-grouped-gemm": "grouped GEMM kernels (TransformerEngine's GroupedLinear or the grouped_gemm package)",
    "--moe-permute-fusion": "TransformerEngine's fused token permutation",
}
# Flags that name things only the case's cluster has (its data, its code, its W&B server), and why they go.
NOT_HERE = {
    "--hf-checkpoint": "the 235B model: nanscope's tiny Qwen3-MoE instead (config.json and tokenizer, written here)",
    "--ref-load": "the 235B checkpoint: the tiny model's torch_dist checkpoint, written here",
    "--load": "the run's checkpoint dir: an empty dir here, so slime starts from --ref-load (arguments.py:902-914)",
    "--save": "the run's checkpoint dir: the empty dir of --load",
    "--prompt-data": "the prompts: the rollout is nanscope's file (--load-debug-rollout-data), so no dataset",
    "--input-key": "a column of --prompt-data",
    "--label-key": "a column of --prompt-data",
    "--custom-generate-function-path": "deepresearch's generate function: under --load-debug-rollout-data the "
    "rollout is read from the file (ray/buffer.py:46-50), never generated",
    "--custom-rm-path": "deepresearch's reward function: the rewards are in the rollout file",
    "--rollout-num-gpus-per-engine": "SGLang's engines: none starts under --debug-train-only (rollout.py:16)",
    "--wandb-key": "the case's W&B login (no network here)",
    "--wandb-host": "the case's W&B server (no network here)",
    "--use-wandb": "the case's W&B server; with --plugin, W&B in offline mode instead",
}
# The README's plugin lines (README.md, "add these lines to your launch script").
PLUGIN_LOSS = ("--loss-type", "custom_loss", "--custom-loss-function-path", "nanscope.slime_plugin.policy_loss")
PLUGIN_HOOK = ("--custom-megatron-before-train-step-hook-path", "nanscope.slime_plugin.before_train_step")
SGLANG_PREFIX = "--sglang-"  # every --sglang-* flag configures SGLang's engines: none starts
# The case's values resized to a world of 4 ranks and the tiny model, and why each value.
RESIZED = {
    "--actor-num-nodes": ("1", "one node"),
    "--actor-num-gpus-per-node": (str(WORLD), "4 logical GPUs (Ray resources) = 4 ranks"),
    "--rollout-num-gpus": (str(WORLD), "the actor's GPUs (no engines start)"),
    "--num-rollout": (
        "2",
        "two rollouts: the hazard's, then a healthy one (skip mode trains on after the skipped step; "
        "W&B's offline file holds the first step before train.py exits and Ray kills the actors)",
    ),
    "--rollout-batch-size": ("2", "2 prompts x 8 samples = 16 samples"),
    "--global-batch-size": ("16", "one optimizer step per rollout, as the case's 64 x 8 / 512"),
    "--rollout-max-response-len": ("64", "the tiny rollout's responses (under 40 tokens)"),
    "--tensor-model-parallel-size": ("2", "TP2 x PP2 = 4 ranks (DP 1)"),
    "--pipeline-model-parallel-size": ("2", "PP > 1: the 1F1B schedule of the case's frames"),
    "--context-parallel-size": ("1", "CP > 1 needs TransformerEngine's attention (dot_product_attention.py:53)"),
    "--expert-model-parallel-size": ("2", "EP2 x ETP1 over the TP2 ranks: the alltoall dispatcher across ranks"),
    "--decoder-last-pipeline-num-layers": ("2", "4 layers over PP2: 2 on the last stage"),
    "--max-tokens-per-gpu": ("128", "several samples per micro-batch, as 16384 packs the case's"),
}
# Flags added for the CPU run, and why.
ADDED_WHY = {
    "--debug-train-only": "train on the rollout file, no SGLang engines (placement_group.py:75, actor.py:310, :318)",
    "--load-debug-rollout-data": "nanscope's rollout (slime's Sample.to_dict() rows), the hazard planted in it",
    "--disable-rollout-global-dataset": "no prompt dataset (the rollout is the file)",
    "--sglang-router-ip": "set, so no router process starts (ray/rollout.py:115)",
    "--sglang-router-port": "with --sglang-router-ip",
    "--transformer-impl": "local: megatron-core's own layers (no TransformerEngine on CPU)",
    "--custom-megatron-init-path": "sets args.spec in each actor: the local spec with a CPU variable-length "
    "attention for slime's THD micro-batches, which slime's provider reads (model_provider.py:59-63); --spec "
    "itself fails Megatron-LM's validate_args for a MoE model (training/arguments.py:941)",
    "--no-masked-softmax-fusion": "the fused softmax is a CUDA kernel (fusions/fused_softmax.py:218)",
    "--no-rope-fusion": "TransformerEngine's fused RoPE (transformer_config.py:1179 refuses it without TE)",
    "--no-gradient-accumulation-fusion": "APEX's fused_weight_gradient_mlp_cuda kernel (tensor_parallel/layers.py:909)",
}


# Flags every CPU process of the run adds (the checkpoint writer's too): fused paths the CPU has no kernel for.
CPU_FLAGS = ("--no-masked-softmax-fusion", "--no-rope-fusion", "--no-gradient-accumulation-fusion")


@dataclass(frozen=True)
class Paths:
    """What nanscope writes for the run, as train.py's flags see them."""

    hf: str  # --hf-checkpoint
    ref: str  # --ref-load (torch_dist)
    ckpt: str  # --load / --save: an empty dir
    rollout: str  # --load-debug-rollout-data
    wandb: str | None = None  # --wandb-dir (with --plugin)
    dumps: str | None = None  # --save-debug-rollout-data template (with --plugin)


@dataclass(frozen=True)
class Plan:
    """train.py's argv and every departure from the case's launch, each with its reason."""

    argv: tuple[str, ...]
    kept: tuple[str, ...]  # case flags passed as the case wrote them
    resized: tuple[tuple[str, str, str, str], ...]  # (flag, case value, run value, why)
    dropped: tuple[tuple[str, str], ...]  # (flag as the case wrote it, why): CPU-impossible first
    added: tuple[tuple[str, str], ...]  # (flag and value, why)
    model: tuple[str, ...] = field(default=())  # the tiny model's args (the case's model args are not shared)


def model_args(sizes: TinyQwen3MoE = TinyQwen3MoE()) -> list[str]:
    """The tiny Qwen3-MoE as slime's scripts/models/qwen3-235B-A22B.sh writes the big one, at `sizes`."""
    return [
        "--disable-bias-linear", "--qk-layernorm", "--group-query-attention",
        "--num-attention-heads", str(sizes.num_attention_heads), "--num-query-groups", str(sizes.num_query_groups),
        "--kv-channels", str(sizes.kv_channels), "--num-layers", str(sizes.num_layers),
        "--hidden-size", str(sizes.hidden_size), "--ffn-hidden-size", str(sizes.ffn_hidden_size),
        "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--norm-epsilon", str(sizes.norm_epsilon),
        "--rotary-percent", "1.0", "--swiglu", "--untie-embeddings-and-output-weights",
        "--vocab-size", str(sizes.vocab_size), "--rotary-base", str(sizes.rotary_base),
        "--moe-ffn-hidden-size", str(sizes.moe_ffn_hidden_size), "--moe-router-score-function", "softmax",
        "--moe-token-dispatcher-type", "alltoall", "--moe-router-topk", str(sizes.moe_router_topk),
        "--num-experts", str(sizes.num_experts), "--moe-token-drop-policy", "probs", "--moe-router-dtype", "fp32",
        "--moe-aux-loss-coeff", "0",
    ]  # fmt: skip


def cpu_args() -> list[str]:
    """The flags every CPU process of the run adds (the checkpoint writer's too)."""
    return ["--transformer-impl", "local", *CPU_FLAGS]


def launch(case_flags: Mapping[str, list[str]], paths: Paths, *, lines: tuple[int, ...] = ()) -> Plan:
    """train.py's argv for the CPU run, from the case's flags (`{flag: [values]}`, as launch.sh gives them).

    lines: the README's plugin lines to add (1 the loss, 2 the sentinel hook, 3 the rollout dumps), with W&B offline.
    """
    argv, kept, resized, dropped, sglang = [], [], [], [], []
    for flag, values in case_flags.items():
        if flag in CPU_IMPOSSIBLE:
            dropped.append((_shown(flag, values), CPU_IMPOSSIBLE[flag]))
        elif flag in NOT_HERE:
            dropped.append((_shown(flag, values), NOT_HERE[flag]))
        elif flag.startswith(SGLANG_PREFIX):
            sglang.append(flag)
        elif flag in RESIZED:
            value, why = RESIZED[flag]
            resized.append((flag, " ".join(values), value, why))
            argv += [flag, value]
        else:
            kept.append(flag)
            argv += [flag, *values]
    if sglang:
        dropped.append((" ".join(sglang), "SGLang's engine flags: no engine starts under --debug-train-only"))
    dropped += [(flag, why) for flag, why in MODEL_CPU_IMPOSSIBLE.items()]
    dropped.sort(key=lambda item: item[0].split()[0] not in CPU_IMPOSSIBLE and item[0] not in MODEL_CPU_IMPOSSIBLE)
    added = _added(paths, lines)
    for tokens, _ in added:
        argv += tokens
    model = model_args()
    shown = tuple((" ".join(tokens), why) for tokens, why in added)
    return Plan(
        argv=tuple(argv + model),
        kept=tuple(kept),
        resized=tuple(resized),
        dropped=tuple(dropped),
        added=shown,
        model=tuple(model),
    )


def _added(paths: Paths, lines: tuple[int, ...]) -> list[tuple[tuple[str, ...], str]]:
    files = [
        (("--hf-checkpoint", paths.hf), "the tiny Qwen3-MoE's config.json and tokenizer (nanscope writes them)"),
        (("--ref-load", paths.ref), "the tiny model's torch_dist checkpoint (Megatron-LM's save_checkpoint)"),
        (("--load", paths.ckpt), NOT_HERE["--load"]),
        (("--save", paths.ckpt), NOT_HERE["--save"]),
        (("--debug-train-only",), ADDED_WHY["--debug-train-only"]),
        (("--load-debug-rollout-data", paths.rollout), ADDED_WHY["--load-debug-rollout-data"]),
        (("--disable-rollout-global-dataset",), ADDED_WHY["--disable-rollout-global-dataset"]),
        (("--sglang-router-ip", ROUTER[0]), ADDED_WHY["--sglang-router-ip"]),
        (("--sglang-router-port", ROUTER[1]), ADDED_WHY["--sglang-router-port"]),
        (("--transformer-impl", "local"), ADDED_WHY["--transformer-impl"]),
        (("--custom-megatron-init-path", INIT_HOOK), ADDED_WHY["--custom-megatron-init-path"]),
    ]
    files += [((flag,), ADDED_WHY[flag]) for flag in CPU_FLAGS]
    if lines:
        files += [
            (
                ("--use-wandb", "--wandb-mode", "offline", "--wandb-dir", paths.wandb),
                "the plugin's nanscope/* metrics, offline",
            ),
            (
                ("--disable-wandb-random-suffix",),
                "slime v0.1.0's random run suffix calls wandb.util.generate_id (wandb_utils.py:40), which wandb 0.31 "
                "(nanscope[logging]) no longer has",
            ),
        ]
    readme = {
        1: [(PLUGIN_LOSS, "the plugin, README line 1: the NaN-safe loss")],
        2: [(PLUGIN_HOOK, "the plugin, README line 2: the sentinel")],
        3: [(("--save-debug-rollout-data", paths.dumps), "the plugin, README line 3: every rollout kept")],
    }
    files += [added for line in sorted(lines) for added in readme[line]]
    return files


def _shown(flag: str, values: list[str]) -> str:
    return " ".join([flag, *values]) if len(values) <= 3 else f"{flag} {' '.join(values[:3])} ..."
