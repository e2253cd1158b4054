"""A tiny Qwen3-MoE on megatron-core's GPTModel, wrapped and optimised as slime v0.1.0 does it.

The architecture follows the case's model.json (Qwen3-235B-A22B) scaled down to run on 2 CPU cores:
GQA with 4 query groups and kv_channels independent of hidden/heads, qk-layernorm, RMSNorm, SwiGLU,
MoE on every layer (8 experts, top-2, softmax router computed in fp32), rotary positions, untied
embeddings, no bias. bf16 parameters under megatron's Float16Module (so the last stage hands the loss
fp32 logits, as slime asserts) with Float16OptimizerWithFloat16Params (fp32 main params), DDP with
check_for_nan_in_grad and grad_reduce_in_fp32, and megatron's Adam with the case's lr / weight decay /
betas. `bf16=False` gives an all-fp32 model (about 4x faster on CPU).

`build_chunks` builds the layouts slime's flags make (`Training`): a chunk per virtual pipeline stage,
the overlapped reduce, megatron's check off, the distributed optimizer, full activation recompute.

Callers must have run `nanscope.megatron.cpu.install()` and `parallel_state.initialize_model_parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanscope.megatron.sizes import TinyQwen3MoE

__all__ = ["OUTPUT_INIT_STD", "TinyQwen3MoE"]  # TinyQwen3MoE lives in sizes.py (torch-free), named here too

# Scale of the output layer's weights: the tiny model's logits span tens of units, like a trained
# LLM's, so at temperature 0.8 the least likely tokens sit far below -FP32_EXP_MAX (-88.72).
OUTPUT_INIT_STD = 16.0


class SequenceParallelRMSNorm(torch.nn.Module):
    """RMSNorm that accepts sequence parallelism (the local spec's torch norm asserts it is off).

    With sequence parallelism each TP rank holds a slice of the sequence, so the weight's gradient
    is partial; `sequence_parallel=True` makes finalize_model_grads all-reduce it over TP, as
    TransformerEngine's norm does. The same holds for the qk-norms, shared by every head.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.size(-1),), self.weight, self.eps)


@dataclass(frozen=True)
class Training:
    """How megatron wraps and trains the model chunks: slime's flags that change the step's layout."""

    vpp: int | None = None  # --virtual-pipeline-model-parallel-size: one chunk per virtual stage (interleaved 1F1B)
    overlap_grad_reduce: bool = False  # --overlap-grad-reduce: the reduce goes out inside the backward pass
    check_for_nan_in_grad: bool = True  # --check-for-nan-in-loss-and-grad (slime's default; off: --no-check-...)
    distributed_optimizer: bool = False  # --use-distributed-optimizer (slime always sets it)
    recompute: bool = False  # --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
    # --ddp-bucket-size: with the overlapped reduce, small buckets make one reduce per bucket, issued in backward
    bucket_size: int | None = None


def transformer_config(
    sizes: TinyQwen3MoE = TinyQwen3MoE(), *, bf16: bool = True, seed: int = 0, training: Training = Training()
):
    """The TransformerConfig for the current parallel state (TP/PP/EP sizes read from it)."""
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, imported by bootstrap first
    from megatron.core.transformer import TransformerConfig

    tp = mpu.get_tensor_model_parallel_world_size()
    return TransformerConfig(
        num_layers=sizes.num_layers,
        hidden_size=sizes.hidden_size,
        num_attention_heads=sizes.num_attention_heads,
        num_query_groups=sizes.num_query_groups,
        kv_channels=sizes.kv_channels,
        ffn_hidden_size=sizes.ffn_hidden_size,
        moe_ffn_hidden_size=sizes.moe_ffn_hidden_size,
        num_moe_experts=sizes.num_experts,
        moe_router_topk=sizes.moe_router_topk,
        moe_router_score_function="softmax",
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="none",
        moe_token_dispatcher_type="allgather",  # alltoall creates a CUDA stream at construction
        moe_grouped_gemm=False,
        qk_layernorm=True,
        normalization="RMSNorm",
        layernorm_epsilon=sizes.norm_epsilon,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=mpu.get_pipeline_model_parallel_world_size(),
        expert_model_parallel_size=mpu.get_expert_model_parallel_world_size(),
        expert_tensor_parallel_size=mpu.get_expert_tensor_parallel_world_size(),
        sequence_parallel=tp > 1,  # MoE with TP > 1 requires it; the case runs TP4 with SP
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_cpu_initialization=True,
        perform_initialization=True,
        init_method_std=0.02,
        **_layout_fields(training),
    )


def _layout_fields(training: Training) -> dict:
    """The TransformerConfig fields a Training sets (none for the default: the config stays as it was)."""
    fields = {}
    if training.vpp is not None:
        # Megatron-LM's defaults for the interleaved schedule (training/arguments.py:536-545, :1158, :2348 at
        # core_v0.15.0rc0): p2p overlapped with compute, so not batched; at PP 2 it refuses anything else, since a
        # batch would hold two sends and two receives between the same two ranks
        fields.update(virtual_pipeline_model_parallel_size=training.vpp, overlap_p2p_comm=True, batch_p2p_comm=False)
    if training.recompute:
        fields.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return fields


def layer_spec(config, vp_stage: int | None = None):
    """The local (no TransformerEngine) block spec with every norm swapped for SequenceParallelRMSNorm."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # heavy: megatron-core
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    spec = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts,
        moe_grouped_gemm=False,
        qk_layernorm=True,
        normalization="RMSNorm",
    )
    spec.submodules.input_layernorm = SequenceParallelRMSNorm
    spec.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    spec.submodules.self_attention.submodules.q_layernorm = SequenceParallelRMSNorm
    spec.submodules.self_attention.submodules.k_layernorm = SequenceParallelRMSNorm
    n = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[spec] * n, layer_norm=SequenceParallelRMSNorm)


def build_model(sizes: TinyQwen3MoE = TinyQwen3MoE(), *, seed: int = 0, bf16: bool = True):
    """This rank's pipeline stage of the tiny model, wrapped as megatron's get_model does.

    Returns:
        (ddp_model, config): `ddp_model` is DDP(Float16Module(GPTModel)) with check_for_nan_in_grad
        and grad_reduce_in_fp32, as slime sets them.
    """
    (ddp,), config = build_chunks(sizes, seed=seed, bf16=bf16)
    return ddp, config


def build_chunks(
    sizes: TinyQwen3MoE = TinyQwen3MoE(), *, seed: int = 0, bf16: bool = True, training=Training(), cuda: bool = False
):
    """This rank's model chunks (one per virtual pipeline stage, else one), wrapped as Megatron-LM's get_model and
    slime's setup_model_and_optimizer do (training/training.py:1094-1114 and :1224-1235 at core_v0.15.0rc0:
    DDP per chunk, bucketing off from the second chunk on).

    Args:
        cuda: on the current CUDA device, as Megatron-LM's get_model moves each chunk (the CPU harness: False).

    Returns:
        ([DDP(Float16Module(GPTModel)) per chunk], config).
    """
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, imported by bootstrap first
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    # Same seed on every run: parameters are identical across runs of one launch.
    torch.manual_seed(seed + 100 * mpu.get_pipeline_model_parallel_rank())
    tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    config = transformer_config(sizes, bf16=bf16, seed=seed, training=training)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        check_for_nan_in_grad=training.check_for_nan_in_grad,
        overlap_grad_reduce=training.overlap_grad_reduce,
        use_distributed_optimizer=training.distributed_optimizer,
        bucket_size=training.bucket_size if training.overlap_grad_reduce else None,
    )
    chunks = []
    for vp_stage in range(training.vpp or 1):
        model = _gpt_chunk(sizes, config, None if training.vpp is None else vp_stage)
        if cuda:
            model = model.cuda(torch.cuda.current_device())
        ddp = DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=model, disable_bucketing=vp_stage > 0
        )
        ddp.broadcast_params()
        chunks.append(ddp)
    return chunks, config


def _gpt_chunk(sizes: TinyQwen3MoE, config, vp_stage: int | None):
    """One chunk: GPTModel on this stage's (virtual stage's) layers, Float16Module under bf16."""
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, imported by bootstrap first
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.module import Float16Module

    virtual = {} if vp_stage is None else {"ignore_virtual": False, "vp_stage": vp_stage}
    last = mpu.is_pipeline_last_stage(**virtual)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(config, vp_stage),
        vocab_size=sizes.vocab_size,
        max_sequence_length=sizes.max_sequence_length,
        pre_process=mpu.is_pipeline_first_stage(**virtual),
        post_process=last,
        parallel_output=True,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=sizes.rotary_base,
        **({} if vp_stage is None else {"vp_stage": vp_stage}),
    )
    if last:
        with torch.no_grad():
            model.output_layer.weight.normal_(0.0, OUTPUT_INIT_STD / sizes.hidden_size**0.5)
    return Float16Module(config, model) if config.bf16 else model


CASE_LR = 1e-6  # the case's --lr (constant: --lr-decay-style constant)


def build_optimizer(
    ddp_model, *, bf16: bool = True, lr: float = CASE_LR, distributed: bool = False, cpu_offload: bool = False
):
    """Megatron's Adam set up like the case: lr 1e-6 (unless `lr`), weight decay 0.1, betas 0.9/0.98.

    Args:
        ddp_model: a DDP chunk, or the list of a rank's chunks.
        distributed: megatron's distributed optimizer (the chunks' DDP must have use_distributed_optimizer).
        cpu_offload: --optimizer-cpu-offload --optimizer-offload-fraction 1 --use-precision-aware-optimizer, as the
            case runs it: megatron-core's HybridDeviceOptimizer (CUDA only: it takes the current stream and pins
            memory, cpu_offloading/hybrid_optimizer.py:217); needs `distributed`.
    """
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # heavy: megatron-core

    config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_eps=1e-8,
        clip_grad=1.0,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_distributed_optimizer=distributed,
        **({"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0, "use_precision_aware_optimizer": True}
           if cpu_offload else {}),
    )  # fmt: skip
    chunks = ddp_model if isinstance(ddp_model, list) else [ddp_model]
    return get_megatron_optimizer(config, chunks)


def layers_held(config) -> list[int]:
    """0-based decoder layer indices on this pipeline stage (Megatron's layer_number is 1-based)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build  # heavy: megatron-core
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    offset = get_transformer_layer_offset(config)
    return list(range(offset, offset + get_num_layers_to_build(config)))
