"""The one way nanscope starts megatron-core on CPU: every worker, test worker and benchmark calls this.

    from nanscope.megatron import bootstrap
    bootstrap.init(tp=2, pp=2)                                 # under torchrun (env:// rendezvous)
    bootstrap.init()                                           # one process: a gloo group of one rank
    model, config, optimizer = bootstrap.build_training(seed=0, bf16=True)

In this order: megatron-core imported with torch.compile deferred (`import_megatron`), the CPU layer
(`cpu.install()`, always: the harness runs on CPU over gloo even where CUDA is visible), the gloo
process group, megatron's parallel state; then the tiny model, megatron's optimizer and the
grad-finalize wiring slime's train step relies on.
"""

from __future__ import annotations

import datetime
import functools
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

    megatron.core.jit binds `jit_fuser = torch.compile` and decorates about 40 fused functions with it
    at import; torch.compile's first decoration imports TorchInductor, about 1 s of a rank's 3 s of
    imports on CPU, for functions the harness never calls (measured: none is called in a matrix run).
    While megatron.core.jit is imported, torch.compile is replaced by `_compile_on_first_call`: the
    decorated function is compiled by the real torch.compile when it is first called, as torch.compile
    itself compiles lazily, so a call behaves the same. torch.compile is restored before this returns;
    nothing else sees the stand-in.
    """
    import torch

    if "megatron.core.jit" not in sys.modules:
        real = torch.compile
        torch.compile = functools.partial(_compile_on_first_call, real)
        try:
            import megatron.core.jit  # noqa: F401  (binds jit_fuser to the stand-in)
        finally:
            torch.compile = real
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401


def _compile_on_first_call(compile_, fn=None, **options):
    """torch.compile(fn, **options), compiled at fn's first call (also as a decorator with options only)."""
    if fn is None:
        return functools.partial(_compile_on_first_call, compile_, **options)
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = compile_(fn, **options)
        return compiled(*args, **kwargs)

    return call


def init(
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    timeout_s: float = 180.0,
    group_timeout_s: float | None = None,
) -> None:
    """The CPU layer, the gloo process group and megatron's parallel state, once per process.

    Under torchrun (WORLD_SIZE set) the group joins torchrun's rendezvous; otherwise it is a group
    of one rank on a free local port.

    Args:
        tp, pp, cp, ep, etp: megatron's parallel sizes (data parallel is what the world leaves).
        timeout_s: bound on the process-group rendezvous.
        group_timeout_s: bound on megatron's process groups' collectives, rounded up to whole minutes
            (megatron's unit); None for megatron's default.
    """
    import torch.distributed as dist

    import_megatron()
    from megatron.core import parallel_state as mpu

    from nanscope.megatron import cpu

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
        **minutes,
    )


def build_training(*, seed: int = 0, bf16: bool = True):
    """This rank's stage of the tiny model, megatron's Adam, and the config wired as slime's train step.

    Returns:
        (ddp_model, config, optimizer): config.finalize_model_grads_func is megatron's
        finalize_model_grads (DP all-reduce and the DDP bucket NaN check), grad_scale_func the
        optimizer's loss scaling, timers off.
    """
    from megatron.core.distributed import finalize_model_grads

    from nanscope.megatron import model

    ddp, config = model.build_model(seed=seed, bf16=bf16)
    optimizer = model.build_optimizer(ddp, bf16=bf16)
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.timers = None
    return ddp, config, optimizer
