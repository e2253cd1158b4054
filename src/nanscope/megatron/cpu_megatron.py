"""The CPU layer's stand-ins for megatron-core's CUDA-only parts (`cpu.install` puts them in place), and its
import with torch.compile deferred (`compile_on_first_call`, `bootstrap.import_megatron`)."""

from __future__ import annotations

import contextlib
import functools

import torch


class CpuRngTracker:
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


class CpuRecomputeRng:
    """CPU stand-ins for megatron's save and restore of the CUDA generator around activation recompute
    (tensor_parallel/random.py:383 and :391, `_get_all_rng_states` / `_set_all_rng_states`, which
    CheckpointFunction calls in forward and in the recompute of backward): there is no CUDA generator on CPU.
    The CPU generator and the tracker's states, which those functions save and restore beside it, are the
    ones the CPU harness draws from (`CpuRngTracker`)."""

    @staticmethod
    def get_state(*_args, **_kwargs) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)

    @staticmethod
    def set_state(*_args, **_kwargs) -> None:
        return None


def split_sizes_to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    """megatron's maybe_move_tensor_to_cpu for tensors already on cpu: as_numpy converts them as it does a CUDA one's."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


class AdamWAfterInitState(torch.optim.AdamW):
    """torch.optim.AdamW that starts a state megatron's init_state_fn filled (exp_avg, exp_avg_sq, no `step`) at step 0,
    as its own lazy init would have; the update is torch's."""

    @torch.no_grad()
    def step(self, closure=None):
        for state in self.state.values():
            if state and "step" not in state:
                state["step"] = torch.tensor(0.0)
        return super().step(closure)


@contextlib.contextmanager
def compile_on_first_call():
    """Within the block, torch.compile compiles a function when it is first called, not when it decorates it.

    megatron.core.jit binds `jit_fuser = torch.compile` and decorates about 40 fused functions with it at
    import; torch.compile's first decoration imports TorchInductor, about 1 s of a rank's 3 s of imports on
    CPU, for functions the harness never calls (measured: none is called in a matrix run). A decorated
    function is compiled by the real torch.compile at its first call, as torch.compile itself compiles
    lazily, so a call behaves the same. torch.compile is restored when the block ends.
    """
    real = torch.compile
    # torch.compile: compiles (importing TorchInductor) when it decorates -> compiles at the first call.
    torch.compile = functools.partial(_compile_on_first_call, real)
    try:
        yield
    finally:
        torch.compile = real


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
