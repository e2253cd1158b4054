"""The plugin's collectives: small all-reduces on the device the group's backend takes.

slime's default process group is NCCL-only (v0.1.0 slime/ray/train_actor.py:46,
`init_process_group(backend="nccl")`), and NCCL refuses a CPU tensor ("No backend type associated with
device type cpu"): every collective of the plugin uses the current CUDA device there. Under gloo (the CPU
harness, or a "cpu:gloo,cuda:nccl" group) a CPU tensor is taken and costs no device sync.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def device(group=None) -> torch.device:
    """The device for a collective on `group` (default: the world): CPU if its backend takes CPU tensors, else
    the current CUDA device (`torch.device("cuda")`, no index: where a tensor made on it lands)."""
    try:
        config = dist.get_backend_config(group)  # e.g. "cuda:nccl", "cpu:gloo,cuda:gloo"
    except AttributeError:  # torch < 2.2: one backend per group
        config = "cpu:gloo" if dist.get_backend(group) == "gloo" else "cuda:" + dist.get_backend(group)
    types = {pair.split(":")[0] for pair in config.split(",")} if ":" in config else {"cuda"}
    return torch.device("cpu") if "cpu" in types else torch.device("cuda")


def all_reduce_max(values: list[float], group=None) -> list[float]:
    """The element-wise maximum of `values` over the group's ranks (one collective, one host sync)."""
    if not dist.is_initialized():
        return list(values)
    flags = torch.tensor(values, dtype=torch.float32, device=device(group))
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return flags.tolist()
