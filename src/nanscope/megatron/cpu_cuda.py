"""The CPU layer's stand-ins for torch.cuda and torch's CUDA-only tensor calls (`cpu.install` puts them in place).

Each stands in for one CUDA-only call megatron-core, Megatron-LM or slime makes; `cpu.py`'s patch lists say which
call each replaces, and where it is made.
"""

from __future__ import annotations

import os
import types

import torch


def cpu_device(*_args, **_kwargs) -> torch.device:
    """torch.cuda.current_device() on cpu."""
    return torch.device("cpu")


def tensor_cuda(self, *_args, **_kwargs):
    """Tensor.cuda() on cpu: the tensor itself."""
    return self


def on_cpu(factory):
    """Wrap a tensor factory so that device='cuda' (a literal in megatron's optimizer, schedules and
    RerunStateMachine) lands on cpu."""

    def wrapped(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    wrapped.__wrapped__ = factory
    return wrapped


_TENSOR_TYPE = torch.Tensor.type


def cuda_type_name(self, dtype=None, non_blocking=False, **kwargs):
    """Tensor.type() with no argument names a cpu tensor as its CUDA twin ('torch.cuda.FloatTensor')."""
    if dtype is None and not kwargs and self.device.type == "cpu":
        with (
            torch._C.DisableTorchFunction()
        ):  # under a TorchFunctionMode (the tracer) the C method dispatches back here
            return _TENSOR_TYPE(self).replace("torch.", "torch.cuda.", 1)
    return _TENSOR_TYPE(self, dtype, non_blocking, **kwargs)


def h100_properties(*_args, **_kwargs):
    """What torch.cuda.get_device_properties says of an H100 (SXM), the case's GPU, in the fields megatron reads."""
    return types.SimpleNamespace(name="NVIDIA H100 80GB HBM3 (nanscope: a CPU rank)", major=9, minor=0,
                                 total_memory=80 * 1024**3, multi_processor_count=132, uuid="nanscope-cpu")  # fmt: skip


def unpinned(factory):
    """A tensor factory that ignores pin_memory= (page-locking needs a CUDA driver)."""

    def wrapped(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    wrapped.__wrapped__ = factory
    return wrapped


def host_memory(*_args, **_kwargs) -> tuple[int, int]:
    """(free, total) bytes of the host's memory, as torch.cuda.mem_get_info gives them for a GPU."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


class CpuStream:
    """torch.cuda.Stream on cpu: work is already ordered, so waiting, recording and synchronising do nothing."""

    def __init__(self, *_args, **_kwargs):
        pass

    @staticmethod
    def current(*_args, **_kwargs) -> CpuStream:
        return _DEFAULT_STREAM

    def wait_stream(self, _other) -> None:
        pass

    def record_event(self, *_args) -> CpuStream:
        return self  # an event's synchronize() and a stream's are both nothing to wait for

    def synchronize(self) -> None:
        pass


_DEFAULT_STREAM = CpuStream()
