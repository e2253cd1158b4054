"""CUDA hidden from every process the CPU harness starts: the variables each one gets in its environment, so that
nothing in it can initialise the CUDA driver, whatever imports torch's CUDA first.

The harness runs on CPU over gloo by design, also on a GPU node. There, torchrun's agent (`python -m
nanscope.megatron.worker`) would initialise the CUDA driver before it forks the ranks: torch's LaunchConfig calls
`torch.cuda.is_available()`, and megatron-core's fused MoE modules can at import. A process forked after that cannot
use CUDA, and each rank died in megatron-core's optimizer.py:526 (`step_with_ready_grads`, through torch's AdamW,
whose graph-capture check asks CUDA for the current stream) with "CUDA error: initialization error". With CUDA hidden
every process answers as on a CPU-only machine, so every record is a CPU-only machine's:

- `CUDA_VISIBLE_DEVICES` names no device: torch.cuda.is_available() is False, and no CUDA context is made;
- `PYTORCH_NVML_BASED_CUDA_CHECK=1`: torch answers is_available() and device_count() from NVML and the variable
  above, without initialising the CUDA driver (torch/cuda/__init__.py, `_nvml_based_avail`).

`HARNESS` is what the torchrun agent and its forked ranks, and the Ray driver, its local Ray instance and the train
group's actors get (`launcher._spawn`; the actors, joining a cluster, through their runtime env too).

slime's own train.py (`nanscope repro --slime-src`) needs the variable to name its GPUs: Ray offers the run logical
GPUs, slime schedules its actors on them, and slime looks its GPU id up in it (slime v0.1.0 ray/train_actor.py:12-17,
`cvd.split(",").index(str(ray.get_gpu_ids()[0]))`), and Ray refuses to offer more GPUs than it names
(ray/_private/resource_and_label_spec.py, `_resolve_accelerator_resources`). `slime_run(gpus)` names them behind an
invalid first index, `-1,0,1,2` for 4: CUDA and torch stop at the first invalid index and see no device, while Ray
maps its GPU slot i to entry i (`Worker.get_accelerator_ids_for_accelerator_resource`), so that slime's lookup gives
slot i, as where the variable is unset. `RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1` keeps Ray from replacing the
variable for an actor that holds a GPU (slime sets it itself for its train actors, ray/actor_group.py:61; not for its
placement-group probes).
"""

from __future__ import annotations

from types import MappingProxyType

VISIBLE = "CUDA_VISIBLE_DEVICES"
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
RAY_NOSET = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
NAMES = (VISIBLE, NVML_CHECK, RAY_NOSET)  # every variable this module sets, for the checks that read them back

HARNESS = MappingProxyType({VISIBLE: "", NVML_CHECK: "1"})


def slime_run(gpus: int) -> dict[str, str]:
    """The variables of every process of a CPU run of slime's train.py on a Ray node offering `gpus` logical GPUs.

    Returns:
        {CUDA_VISIBLE_DEVICES: "-1,0,...,gpus-2" (gpus entries, the first invalid), NVML check on, Ray's NOSET on}.
    """
    assert gpus >= 1, gpus
    return {VISIBLE: ",".join(["-1", *map(str, range(gpus - 1))]), NVML_CHECK: "1", RAY_NOSET: "1"}
