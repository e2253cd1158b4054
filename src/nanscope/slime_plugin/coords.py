"""Where this rank sits in the run: global rank, pipeline stage, tensor- and context-parallel coordinates."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Coords:
    """This rank's place in the run, read once when the hook installs.

    Attributes:
        logs: this is the rank slime logs from (data-parallel with CP rank 0, TP rank 0, last pipeline stage).
        last_stage: this rank holds the loss.
    """

    rank: int = 0
    pp: int = 0
    tp: int = 0
    cp_rank: int = 0
    cp_size: int = 1
    dp_rank: int = 0  # data-parallel, without context parallelism (how slime splits a rollout's samples)
    dp_size: int = 1
    logs: bool = True
    last_stage: bool = True

    @classmethod
    def here(cls) -> Coords:
        """From torch.distributed and megatron-core's parallel state (one process when neither is up)."""
        import torch.distributed as dist  # heavy: torch, imported by the caller's process already

        rank = dist.get_rank() if dist.is_initialized() else 0
        try:
            from megatron.core import parallel_state as mpu  # optional: the image's Megatron-LM
        except ImportError:
            return cls(rank=rank)
        if not mpu.model_parallel_is_initialized():
            return cls(rank=rank)
        pp, last = mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size() - 1
        tp = mpu.get_tensor_model_parallel_rank()
        return cls(
            rank=rank,
            pp=pp,
            tp=tp,
            cp_rank=mpu.get_context_parallel_rank(),
            cp_size=mpu.get_context_parallel_world_size(),
            dp_rank=mpu.get_data_parallel_rank(),
            dp_size=mpu.get_data_parallel_world_size(),
            logs=mpu.get_data_parallel_rank(with_context_parallel=True) == 0 and tp == 0 and pp == last,
            last_stage=pp == last,
        )

    def to_dict(self) -> dict:
        return asdict(self)
