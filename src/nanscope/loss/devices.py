"""How numbers the host knows (lengths, offsets, positions) reach the loss's device without a host sync.

A loss on CUDA must not wait for the device: every wait stalls the launch queue. Three ways a host number can
make one, and what this module does instead:

    torch.tensor(values, device=cuda)   builds on the host, then a blocking copy (a stream sync)
    cpu_tensor.to(cuda)                 a blocking copy (a stream sync)
    cpu_tensor.to(cuda, non_blocking=True) from pageable memory: the driver may stage it through pinned memory
                                        and synchronise with the stream (CUDA's API sync behaviour), unseen by
                                        torch.cuda.set_sync_debug_mode

`to_device` copies from pinned memory, non-blocking: the copy is queued behind the work already on the stream and
the host goes on (torch's caching host allocator keeps the pinned block until the copy has run). On the CPU it
is the tensor itself, on `meta` its shape: the meta device is how the CPU tests prove the loss reads no data.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """`t` on `device` without a host sync (see the module docstring); `t` itself when it is there already.

    Args:
        t: any tensor; a CPU tensor bound for CUDA goes through pinned memory.
        device: the loss's device (the logits').
    """
    device = torch.device(device)
    if t.device == device or (device.type == t.device.type and device.index is None):
        return t
    if t.device.type != "cpu":  # not a host number: copied as asked (the loss never brings data to the host)
        return t.to(device)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)  # meta: the shape only


def full(value: float, device, dtype=torch.float32) -> torch.Tensor:
    """A 0-dim tensor holding `value` on `device`, filled there (no copy from the host)."""
    return torch.full((), value, dtype=dtype, device=device)
