"""Test-only stand-ins for the names slime v0.1.0's model.py imports from Megatron-LM's `megatron.training`.

The megatron-core wheel has no `megatron.training`. Importing slime v0.1.0's `slime/backends/megatron_utils/
model.py` needs four names from it (model.py: get_args, get_model; checkpoint.py: load_checkpoint, and
save_checkpoint, which a train step never calls; model_provider.py: core_transformer_config_from_args):

    get_args                            megatron.training.global_vars   the run's args namespace (set_args)
    get_model                           megatron.training.training      build the model chunks from slime's provider
    load_checkpoint, save_checkpoint    megatron.training.checkpointing nothing to load: the run starts from its
                                                                        initial weights; save refuses
    core_transformer_config_from_args   megatron.training.arguments     the tiny Qwen3-MoE's TransformerConfig

`standins.install_megatron_training()` puts this module into sys.modules under those names. None of them is on
the loss or the step path: they build the model (slime's own `setup_model_and_optimizer` then wraps it in
megatron's DDP and builds megatron's distributed optimizer from the args, as in a real run) and hand slime its
args. What train_one_step runs (the zeroing, the hook, megatron's schedule, slime's forward_step, get_batch,
loss_function, finalize_model_grads, DDP's bucket check, the optimizer and scheduler steps) is slime's and
megatron-core's own code.

Two model-construction choices, both the CPU harness's (`nanscope.megatron.model`, `cpu.py`):
- the layer spec is nanscope's local spec (`layer_spec`, reached through slime's own `--spec` path);
- `one_sample_per_micro_batch`: slime's get_batch packs every micro-batch as THD (PackedSeqParams, padded to a
  multiple of 128), which megatron's local attention refuses. With one sample per micro-batch
  (`--micro-batch-size 1`) the packing is [the sample, padding]: causal attention over the padded row gives
  the sample's positions exactly what THD gives them (the padding comes after the sample, RoPE positions
  start at 0 in both), and slime's loss reads the sample's positions only. So the model drops the
  PackedSeqParams of such a micro-batch and refuses any other.
"""

from __future__ import annotations

import torch

_ARGS = None
OUTPUT_INIT_STD = 16.0  # nanscope.megatron.model.OUTPUT_INIT_STD: logits at an LLM's scale


def set_args(args) -> None:
    global _ARGS
    _ARGS = args


def get_args():
    assert _ARGS is not None, "set_args() first"
    return _ARGS


def core_transformer_config_from_args(args, config_class=None):
    """The tiny Qwen3-MoE's TransformerConfig (nanscope.megatron.model) for the current parallel state, with the
    layout flags slime passes through to it (--virtual-pipeline-model-parallel-size, --recompute-granularity full)."""
    from nanscope.megatron import model

    training = model.Training(
        vpp=getattr(args, "virtual_pipeline_model_parallel_size", None),
        recompute=getattr(args, "recompute_granularity", None) == "full",
    )
    config = model.transformer_config(bf16=args.bf16, training=training)
    assert config.num_moe_experts == args.num_experts and config.num_layers == args.num_layers
    return config


def layer_spec(args):
    """slime's `--spec` hook (model_provider.py: `import_module(args.spec)`, called with args): the local spec.

    slime calls it with args alone, never a virtual stage (model_provider.py:60-63); with virtual stages megatron
    wants one to count a chunk's layers. Every virtual stage holds as many here (4 layers, PP 2 x 2 virtual
    stages), so the first stage's count is every chunk's."""
    from nanscope.megatron import model

    vp_stage = 0 if getattr(args, "virtual_pipeline_model_parallel_size", None) is not None else None
    return model.layer_spec(core_transformer_config_from_args(args), vp_stage)


def get_model(model_provider_func, model_type, wrap_with_ddp=True):
    """megatron.training.training.get_model without DDP (slime v0.1.0 wraps the chunks itself): one chunk per
    virtual pipeline stage under --virtual-pipeline-model-parallel-size, else one, as Megatron-LM's builds them
    (training/training.py:1094-1114 at core_v0.15.0rc0: each chunk's pre/post process from its virtual stage).

    As Megatron-LM's: the provider's chunks, tensor-parallel attributes defaulted, Float16Module under --bf16.
    Also: the output layer's weights at the CPU harness's scale (a trained LLM's logit range), and the
    THD adapter of the module docstring.
    """
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.transformer.module import Float16Module

    assert not wrap_with_ddp, "slime v0.1.0 wraps the chunks in DDP itself"
    args = get_args()
    vpp = getattr(args, "virtual_pipeline_model_parallel_size", None)
    if mpu.get_pipeline_model_parallel_world_size() > 1 and vpp is not None:
        chunks = []
        for i in range(vpp):
            first = mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=i)
            last = mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=i)
            chunk = model_provider_func(pre_process=first, post_process=last, vp_stage=i)
            chunk.model_type, chunk.vp_stage = model_type, i
            chunks.append(chunk)
    else:
        chunk = model_provider_func(
            pre_process=mpu.is_pipeline_first_stage(), post_process=mpu.is_pipeline_last_stage()
        )
        chunk.model_type = model_type
        chunks = [chunk]
    for chunk in chunks:
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        if chunk.post_process:
            with torch.no_grad():
                chunk.output_layer.weight.normal_(0.0, OUTPUT_INIT_STD / chunk.config.hidden_size**0.5)
        chunk.register_forward_pre_hook(one_sample_per_micro_batch, with_kwargs=True)
    return [Float16Module(c.config, c) for c in chunks] if args.bf16 else chunks


def one_sample_per_micro_batch(module, args, kwargs):
    """GPTModel's forward pre-hook: a THD micro-batch of one sample (and its padding) as the padded row itself."""
    packed = kwargs.get("packed_seq_params")
    if packed is None:
        return None
    assert packed.qkv_format == "thd", packed.qkv_format
    run = get_args()
    assert run.micro_batch_size == 1 and not run.use_dynamic_batch_size, "one sample per micro-batch only"
    cu = packed.cu_seqlens_q.tolist()
    assert len(cu) <= 3 and cu[0] == 0, f"not one sample and its padding: cu_seqlens {cu}"
    return args, {**kwargs, "packed_seq_params": None}


def load_checkpoint(model, optimizer, opt_param_scheduler, **kwargs):
    """Nothing to load: the run starts from its initial weights (iteration 0, no FLOPs so far)."""
    return 0, 0


def save_checkpoint(*args, **kwargs):
    raise NotImplementedError("the CPU test of train_one_step saves no checkpoint")
