"""Ray's `worker_process_setup_hook` for a CPU run of slime's train.py: the CPU layer in every worker, first.

The run's job sets it in its runtime env (`runtime_env.job_env`, as `ray job submit --runtime-env-json` would), so
Ray calls `setup()` in each worker process it starts for the job, before the worker unpickles any of slime's
classes (MegatronTrainRayActor, RolloutController, the placement-group probes): megatron-core is imported with
torch.compile deferred (`bootstrap.import_megatron`) and `cpu.install_slime` redirects the CUDA-only calls. slime's
own code is not touched; the driver (train.py) needs no patch, it never runs a CUDA call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nanscope.megatron import bootstrap

GPUS_VAR = "NANSCOPE_SLIME_GPUS_PER_NODE"  # the logical GPUs of each Ray node: torch.cuda.device_count() there


@dataclass(frozen=True)
class WorkerSettings:
    """What the hook reads from the job's environment, once."""

    gpus_per_node: int

    @classmethod
    def from_env(cls, env=os.environ) -> WorkerSettings:
        return cls(gpus_per_node=int(env[GPUS_VAR]))


def setup() -> None:
    """Ray's worker_process_setup_hook: megatron-core imported, `cpu.install_slime` applied."""
    from nanscope.megatron import cpu  # heavy: torch and megatron-core, in the run's Ray workers only

    settings = WorkerSettings.from_env()
    torch_probes_triton()
    bootstrap.import_megatron()
    cpu.install_slime(gpus_per_node=settings.gpus_per_node)


def torch_probes_triton() -> bool:
    """torch's own (cached) answer to "is Triton installed", asked before slime imports the Triton stand-in
    (standins/triton: absent to all but slime); False here."""
    from torch.utils._triton import has_triton_package  # heavy: torch

    return has_triton_package()
