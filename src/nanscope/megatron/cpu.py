"""Run megatron-core 0.15.0rc0 on CPU over gloo: the one place nanscope patches megatron or torch.

GPTModel (local layer spec), DDP, the pipeline schedules and the optimizer are device-agnostic apart
from a handful of CUDA-only calls. `install()` redirects exactly those. The harness switches it on
itself (`bootstrap.init`), whether or not CUDA is visible: the harness builds on CPU over gloo by
design, so on a GPU machine the CUDA-only calls must land on CPU all the same. Nothing outside the
harness installs it (the slime plugin runs on the real GPUs, unpatched).

What stays unpatched and still runs on CPU (measured with torch 2.13.0 CPU): gloo's all-reduce,
all-gather, reduce-scatter, all-to-all and p2p send/recv; megatron's RerunStateMachine and the DDP
bucket NaN check (the code path of the case's traceback).

Things that are not patches but choices made by the model builder (see `model.py`) and the harness:
- the local spec's torch norm refuses sequence parallelism, so the layers use `SequenceParallelRMSNorm`;
- the alltoall token dispatcher creates a CUDA stream at construction, so the model uses `allgather`
  (which in turn refuses variable sequence lengths: micro-batches are padded to one length);
- the local attention refuses packed (thd) sequences: one sample per micro-batch.

Usage: `nanscope.megatron.bootstrap.init(...)` calls `cpu.install()` first; nothing else needs to.
"""

from __future__ import annotations

import contextlib

import torch

# (owner, attribute name, original value) of every installed patch, for `uninstall`.
_INSTALLED: list[tuple[object, str, object]] = []
_ABSENT = object()  # the original of an attribute that did not exist (te_general_gemm without TE)


def _cpu_device(*_args, **_kwargs) -> torch.device:
    return torch.device("cpu")


def _tensor_cuda(self, *_args, **_kwargs):
    return self


def _on_cpu(factory):
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


def _cuda_type_name(self, dtype=None, non_blocking=False, **kwargs):
    """Tensor.type() with no argument names a cpu tensor as its CUDA twin ('torch.cuda.FloatTensor')."""
    if dtype is None and not kwargs and self.device.type == "cpu":
        with (
            torch._C.DisableTorchFunction()
        ):  # under a TorchFunctionMode (the tracer) the C method dispatches back here
            return _TENSOR_TYPE(self).replace("torch.", "torch.cuda.", 1)
    return _TENSOR_TYPE(self, dtype, non_blocking, **kwargs)


class _CpuRngTracker:
    """CPU stand-ins for `CudaRNGStatesTracker.add/fork`: named CPU generator states."""

    @staticmethod
    def add(tracker, name, seed):
        if seed in tracker.seeds_:
            raise Exception(f"seed {seed} already exists")
        tracker.seeds_.add(seed)
        if name in tracker.states_:
            raise Exception(f"rng state {name} already exists")
        tracker.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @staticmethod
    @contextlib.contextmanager
    def fork(tracker, name="model-parallel-rng"):
        if name not in tracker.states_:
            raise Exception(f"rng state {name} is not added")
        orig = torch.get_rng_state()
        torch.set_rng_state(tracker.states_[name])
        try:
            yield
        finally:
            tracker.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


def install() -> list[str]:
    """Redirect megatron-core's CUDA-only calls to CPU, whether or not CUDA is visible. Idempotent.

    Returns:
        The names of the patched callables.
    """
    if _INSTALLED:
        return installed()

    from megatron.core.tensor_parallel import random as mp_random
    from megatron.core.transformer.moe import moe_utils

    patches = [
        # torch.cuda.current_device(): device= for buffers, tensor factories and .to() -> cpu.
        (torch.cuda, "current_device", _cpu_device),
        # torch.tensor(..., device='cuda'): scalars in the optimizer and RerunStateMachine -> cpu.
        (torch, "tensor", _on_cpu(torch.tensor)),
        # torch.zeros(..., device='cuda'): token counters in the schedules -> cpu.
        (torch, "zeros", _on_cpu(torch.zeros)),
        # torch.ones(..., device='cuda'): the default causal mask of the local attention -> cpu.
        (torch, "ones", _on_cpu(torch.ones)),
        # Tensor.cuda(): megatron moves scalars/buffers to the GPU -> stay on cpu.
        (torch.Tensor, "cuda", _tensor_cuda),
        # Tensor.type(): the optimizer asserts 'torch.cuda.FloatTensor' / 'torch.cuda.BFloat16Tensor'
        # for params and grads -> cpu tensors report their CUDA type name.
        (torch.Tensor, "type", _cuda_type_name),
        # torch.cuda.synchronize(): nothing to wait for on cpu.
        (torch.cuda, "synchronize", lambda *a, **k: None),
        # CudaRNGStatesTracker.add: torch.cuda.manual_seed/get_rng_state -> a cpu generator state.
        (mp_random.CudaRNGStatesTracker, "add", _CpuRngTracker.add),
        # CudaRNGStatesTracker.fork: swaps the CUDA rng state -> swaps the cpu rng state.
        (mp_random.CudaRNGStatesTracker, "fork", _CpuRngTracker.fork),
        # moe_utils.te_general_gemm: a TransformerEngine symbol, undefined without TE -> None (torch.mm path).
        (moe_utils, "te_general_gemm", None),
    ]
    for owner, name, value in patches:
        _INSTALLED.append((owner, name, getattr(owner, name, _ABSENT)))
        setattr(owner, name, value)
    return installed()


def installed() -> list[str]:
    """Names of the patched callables, e.g. 'torch.cuda.current_device' (empty when not installed)."""
    return [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in _INSTALLED]


def uninstall() -> None:
    """Restore every patched attribute (for tests; a worker process never needs it)."""
    while _INSTALLED:
        owner, name, original = _INSTALLED.pop()
        if original is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
