"""The CPU layer's torch.distributed parts: gloo for the nccl slime names, and one run's agreement on megatron's
gradient check (`agree_on_grad_check`, which the harness's runner wraps around its DDP model)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nanscope.megatron.context import RunContext


def gloo(init_process_group):
    """init_process_group with gloo for any backend slime names (nccl on the GPUs it assumes)."""

    def wrapped(*args, **kwargs):
        if args:
            args = ("gloo", *args[1:])
        else:
            kwargs["backend"] = "gloo"
        return init_process_group(*args, **kwargs)

    wrapped.__wrapped__ = init_process_group
    return wrapped


class PeerFailed(RuntimeError):
    """Raised on a rank whose gradients passed megatron's check when a peer's failed it (spec.PEER_FAILED)."""


def agree_on_grad_check(ctx: RunContext) -> None:
    """After megatron's DDP gradient check, every rank of the replica learns whether any of them failed it.

    A fault in an early pipeline stage's backward makes that stage fail the check while the later stages
    pass theirs and would wait forever in the optimizer's grad-norm all-reduce; on a cluster the job is
    torn down there. Here the passing ranks raise PeerFailed instead, so every rank records the run. The
    failing rank's error time is taken when megatron raised, before this all-reduce (the first raiser
    stays the first). The flag is all-reduced over the model-parallel group (the world at DP 1): a replica
    that passed the check blocks inside megatron's own data-parallel reduce, which a failed replica never
    joins, so a world-wide flag would leave the failed replica waiting for it too.
    """
    import torch.distributed as dist  # heavy: torch.distributed and megatron-core, in the ranks only
    from megatron.core import parallel_state as mpu

    finish = ctx.model.finish_grad_sync

    def any_failed(mine: float) -> bool:
        flag = torch.tensor([mine])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=mpu.get_model_parallel_group())
        return flag.item() > 0

    def wrapped(*args, **kwargs):
        try:
            out = finish(*args, **kwargs)
        except RuntimeError:
            ctx.error_time = time.time()
            any_failed(1.0)
            raise
        if any_failed(0.0):
            raise PeerFailed(
                "a peer rank failed megatron-core's gradient check; this rank's gradients passed it "
                "(on a cluster the job ends here)"
            )
        return out

    # DDP.finish_grad_sync of this run's model: megatron's reduce and bucket check -> them, then the agreement.
    ctx.model.finish_grad_sync = wrapped
