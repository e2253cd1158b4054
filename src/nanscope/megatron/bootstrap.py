"""The one way nanscope starts megatron-core on CPU: every worker, test worker and benchmark calls this.

    from nanscope.megatron import bootstrap
    bootstrap.init(tp=2, pp=2)                                 # under torchrun (env:// rendezvous)
    bootstrap.init()                                           # one process: a gloo group of one rank
    model, transformer_config, optimizer = bootstrap.build_training(seed=0, bf16=True)

In this order: megatron-core imported with torch.compile deferred (`import_megatron`), the CPU layer
(`cpu.install()`, always: the harness runs on CPU over gloo even where CUDA is visible), the gloo
process group, megatron's parallel state; then the tiny model, megatron's optimizer and the
grad-finalize wiring slime's train step relies on.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def import_megatron() -> None:
    """Import megatron-core (what the harness uses of it) with torch.compile deferred to a first call.

    megatron.core.jit decorates about 40 fused functions with torch.compile at import, which would import
    TorchInductor (about 1 s of a rank's 3 s of imports on CPU) for functions the harness never calls; it
    is imported under `cpu_megatron.compile_on_first_call()`, so each of them is compiled by the real torch.compile
    at its first call, and nothing else sees the stand-in.
    """
    from nanscope.megatron import cpu_megatron  # heavy: torch (the agent and the ranks; the parent never imports it)

    if "megatron.core.jit" not in sys.modules:
        with cpu_megatron.compile_on_first_call():
            import megatron.core.jit  # noqa: F401  (binds jit_fuser to the stand-in)
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401


def init(
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int | None = None,
    timeout_s: float = 180.0,
    group_timeout_s: float | None = None,
) -> None:
    """The CPU layer, the gloo process group and megatron's parallel state, once per process.

    Under torchrun (WORLD_SIZE set) the group joins torchrun's rendezvous; otherwise it is a group
    of one rank on a free local port.

    Args:
        tp, pp, cp, ep, etp: megatron's parallel sizes (data parallel is what the world leaves).
        vpp: virtual pipeline stages per pipeline rank (None: none; the chunks: `model.build_chunks`).
        timeout_s: bound on the process-group rendezvous.
        group_timeout_s: bound on megatron's process groups' collectives, rounded up to whole minutes
            (megatron's unit); None for megatron's default.
    """
    import torch.distributed as dist  # heavy: torch and megatron-core, in the processes that run the model

    import_megatron()
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, imported with jit deferred above

    from nanscope.megatron import cpu  # heavy: torch

    cpu.install()
    timeout = datetime.timedelta(seconds=timeout_s)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        url = f"tcp://127.0.0.1:{free_port()}"
        dist.init_process_group("gloo", init_method=url, rank=0, world_size=1, timeout=timeout)
    minutes = {} if group_timeout_s is None else {"distributed_timeout_minutes": max(1, int(-(-group_timeout_s // 60)))}
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        virtual_pipeline_model_parallel_size=vpp,
        **minutes,
    )


def build_layout(*, seed: int = 0, bf16: bool = True, training=None, sizes=None):
    """`build_training` for a layout slime's flags make (`model.Training`): this rank's chunks (one per virtual
    stage), their TransformerConfig wired as slime's train() wires it, and megatron's (distributed) optimizer.

    Args:
        sizes: the model's (model.TinyQwen3MoE; default the harness's).

    Returns:
        (chunks, transformer_config, optimizer): with the overlapped reduce the config carries each chunk's
        no_sync and start_grad_sync (slime v0.1.0 model.py:389-399, --align-grad-reduce).
    """
    from megatron.core.distributed import finalize_model_grads  # heavy: megatron-core and torch

    from nanscope.megatron import model

    training, sizes = training or model.Training(), sizes or model.TinyQwen3MoE()
    chunks, transformer_config = model.build_chunks(sizes, seed=seed, bf16=bf16, training=training)
    optimizer = model.build_optimizer(chunks, bf16=bf16, distributed=training.distributed_optimizer)
    transformer_config.finalize_model_grads_func = finalize_model_grads
    transformer_config.grad_scale_func = optimizer.scale_loss
    transformer_config.timers = None
    if training.overlap_grad_reduce:
        transformer_config.no_sync_func = [chunk.no_sync for chunk in chunks]
        transformer_config.grad_sync_func = [chunk.start_grad_sync for chunk in chunks]
        if len(chunks) == 1:
            transformer_config.no_sync_func = transformer_config.no_sync_func[0]
            transformer_config.grad_sync_func = transformer_config.grad_sync_func[0]
    return chunks, transformer_config, optimizer


def build_training(*, seed: int = 0, bf16: bool = True, lr: float | None = None):
    """This rank's stage of the tiny model, megatron's Adam, and the TransformerConfig wired as slime's train step.

    lr: Adam's learning rate (None: the case's, `model.build_optimizer`'s default).

    Returns:
        (ddp_model, transformer_config, optimizer): transformer_config.finalize_model_grads_func is
        megatron's finalize_model_grads (DP all-reduce and the DDP bucket NaN check), grad_scale_func the
        optimizer's loss scaling, timers off.
    """
    from megatron.core.distributed import finalize_model_grads  # heavy: megatron-core and torch

    from nanscope.megatron import model

    ddp, transformer_config = model.build_model(seed=seed, bf16=bf16)
    optimizer = model.build_optimizer(ddp, bf16=bf16, **({} if lr is None else {"lr": lr}))
    transformer_config.finalize_model_grads_func = finalize_model_grads
    transformer_config.grad_scale_func = optimizer.scale_loss
    transformer_config.timers = None
    return ddp, transformer_config, optimizer
