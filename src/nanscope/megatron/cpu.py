"""Run megatron-core 0.15.0rc0 on CPU over gloo: the one place the harness patches megatron or torch.

Three kinds of patch, each applied by the harness only (the slime plugin, on the real GPUs, wraps only
the model chunks and the optimizer slime hands its hook: `slime_plugin/watch.py`):
- `install()`: megatron-core's CUDA-only calls redirected to CPU, for the whole process;
- `compile_on_first_call()`: torch.compile deferred to a first call while megatron-core is imported
  (`bootstrap.import_megatron`);
- `agree_on_grad_check(ctx)`: one run's DDP model's finish_grad_sync, so that the ranks that passed
  megatron's gradient check learn that a peer failed it.

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
import functools
import os
import time
import types
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nanscope.megatron.context import RunContext

# While installed, the record of `install`'s patches, ((owner, attribute name, original value), ...) in
# the order applied, is kept on the first patched module (torch.cuda), for `installed` and `uninstall`.
_RECORD = "_nanscope_cpu_patches"
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


class _CpuRecomputeRng:
    """CPU stand-ins for megatron's save and restore of the CUDA generator around activation recompute
    (tensor_parallel/random.py:383 and :391, `_get_all_rng_states` / `_set_all_rng_states`, which
    CheckpointFunction calls in forward and in the recompute of backward): there is no CUDA generator on CPU.
    The CPU generator and the tracker's states, which those functions save and restore beside it, are the
    ones the CPU harness draws from (`_CpuRngTracker`)."""

    @staticmethod
    def get_state(*_args, **_kwargs) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)

    @staticmethod
    def set_state(*_args, **_kwargs) -> None:
        return None


def install() -> list[str]:
    """Redirect megatron-core's CUDA-only calls to CPU, whether or not CUDA is visible. Idempotent.

    Returns:
        The names of the patched callables.
    """
    if _applied("torch.cuda.current_device"):
        return installed()

    from megatron.core.tensor_parallel import random as mp_random  # heavy: megatron-core, patched here
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
        # Activation recompute (--recompute-granularity full): random.py:41 _get_cuda_rng_state,
        # torch.cuda.random.get_rng_state -> an empty state (no CUDA generator on CPU).
        (mp_random, "_get_cuda_rng_state", _CpuRecomputeRng.get_state),
        # Activation recompute: random.py:72 _set_cuda_rng_state, the CUDA default generator's set_state -> nothing.
        (mp_random, "_set_cuda_rng_state", _CpuRecomputeRng.set_state),
        # moe_utils.te_general_gemm: a TransformerEngine symbol, undefined without TE -> None (torch.mm path).
        (moe_utils, "te_general_gemm", None),
    ]
    return _apply(patches)


def install_slime(gpus_per_node: int) -> list[str]:
    """On top of `install()`: the CUDA-only calls slime's own train actor makes (`nanscope repro --slime-src`).

    A Ray worker of that run calls this first (`nanscope.slime_train.worker.setup`), before slime's modules load.
    slime v0.1.0's line numbers; megatron-core 0.15.0rc0's. Idempotent; `uninstall` undoes these too.

    Args:
        gpus_per_node: the logical GPUs Ray offers each node (what `torch.cuda.device_count()` would say there).

    Returns:
        The names of every patched callable, `install()`'s first.
    """
    install()
    if _applied("init_process_group"):
        return installed()

    import megatron.core.optimizer as mp_optimizer  # heavy: megatron-core, patched here
    import torch.distributed as dist  # heavy: torch.distributed, in the run's workers only
    from megatron.core.transformer.moe import token_dispatcher

    patches = [
        # torch.cuda.set_device(f"cuda:{local_rank}") (ray/train_actor.py:44, :53): nothing to select on cpu.
        (torch.cuda, "set_device", lambda *a, **k: None),
        # torch.cuda.device_count() (train_actor.py:52, rank % it: 0 on cpu divides by zero) -> the node's logical GPUs.
        (torch.cuda, "device_count", lambda: gpus_per_node),
        # dist.init_process_group(backend="nccl") (train_actor.py:46, hard-coded) -> backend gloo.
        (dist, "init_process_group", _gloo(dist.init_process_group)),
        # torch.empty_like(..., pin_memory=True) (actor.py:122, the cpu copies of the weights) -> unpinned.
        (torch, "empty_like", _unpinned(torch.empty_like)),
        # torch.cuda.Stream() (moe/token_dispatcher.py:424, the alltoall dispatcher's DtoH stream) -> a cpu stand-in.
        (torch.cuda, "Stream", _CpuStream),
        # torch.cuda.current_stream() (token_dispatcher.py:830, :832) -> the one cpu stand-in stream.
        (torch.cuda, "current_stream", _CpuStream.current),
        # torch.cuda.stream(s) (token_dispatcher.py:833) -> no stream to switch to.
        (torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext()),
        # maybe_move_tensor_to_cpu (moe_utils.py:850, bound in token_dispatcher.py:26): the alltoall split sizes' DtoH
        # copy, numpy for all_to_all_single, skipped for a tensor that is not on CUDA -> a cpu tensor converted too.
        (token_dispatcher, "maybe_move_tensor_to_cpu", _split_sizes_to_host),
        # (the CUDA generator's save and restore under activation recompute, random.py:41 and :72: install()'s)
        # torch.cuda.get_rng_state() (Megatron-LM training/checkpointing.py:320, every save_checkpoint, even with
        # --no-save-rng) -> an empty state, as under recompute.
        (torch.cuda, "get_rng_state", _CpuRecomputeRng.get_state),
        # torch.cuda.mem_get_info(device) (slime's memory_utils.available_memory: v0.3.1 memory_utils.py:21, at every
        # actor's init; v0.1.0 memory_utils.py:13, under --offload) -> the host's free and total memory.
        (torch.cuda, "mem_get_info", _host_memory),
        # torch.cuda.memory_allocated(device) (v0.3.1 memory_utils.py:28) -> 0: no CUDA allocator holds anything.
        (torch.cuda, "memory_allocated", lambda *a, **k: 0),
        # torch.cuda.memory_reserved(device) (v0.3.1 memory_utils.py:29) -> 0, as memory_allocated.
        (torch.cuda, "memory_reserved", lambda *a, **k: 0),
        # Adam (optimizer/__init__.py:11-25): TransformerEngine's or Apex's FusedAdam, a CUDA kernel; without them
        # torch's AdamW, whose state needs a `step` that init_state_fn (:376-383, which slime calls eagerly,
        # model.py:142-145) never writes -> torch's AdamW, given the `step` its own init would write (0).
        (mp_optimizer, "Adam", _AdamWAfterInitState),
    ]
    return _apply(patches)


def install_driver() -> list[str]:
    """The CUDA-only call of slime's driver process (train.py parsing its arguments): `nanscope repro --slime-src`.

    The driver imports torch but not megatron-core's layers; its one CUDA-only call is in Megatron-LM's
    validate_args, which slime's parser runs. Applied by the run's sitecustomize (`slime_train/standins`), so that
    slime's train.py stays the driver's top frame. Idempotent; `uninstall` undoes it.
    """
    if _applied("get_device_properties"):
        return installed()
    patches = [
        # torch.cuda.get_device_properties("cuda:0").major (Megatron-LM training/utils.py:413, from validate_args
        # arguments.py:850 at TP > 1) -> the case's H100: compute capability 9.0.
        (torch.cuda, "get_device_properties", _h100_properties),
    ]
    return _apply(patches)


def _h100_properties(*_args, **_kwargs):
    """What torch.cuda.get_device_properties says of an H100 (SXM), the case's GPU, in the fields megatron reads."""
    return types.SimpleNamespace(name="NVIDIA H100 80GB HBM3 (nanscope: a CPU rank)", major=9, minor=0,
                                 total_memory=80 * 1024**3, multi_processor_count=132, uuid="nanscope-cpu")  # fmt: skip


def _gloo(init_process_group):
    """init_process_group with gloo for any backend slime names (nccl on the GPUs it assumes)."""

    def wrapped(*args, **kwargs):
        if args:
            args = ("gloo", *args[1:])
        else:
            kwargs["backend"] = "gloo"
        return init_process_group(*args, **kwargs)

    wrapped.__wrapped__ = init_process_group
    return wrapped


def _unpinned(factory):
    """A tensor factory that ignores pin_memory= (page-locking needs a CUDA driver)."""

    def wrapped(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    wrapped.__wrapped__ = factory
    return wrapped


def _split_sizes_to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    """megatron's maybe_move_tensor_to_cpu for tensors already on cpu: as_numpy converts them as it does a CUDA one's."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def _host_memory(*_args, **_kwargs) -> tuple[int, int]:
    """(free, total) bytes of the host's memory, as torch.cuda.mem_get_info gives them for a GPU."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


class _AdamWAfterInitState(torch.optim.AdamW):
    """torch.optim.AdamW that starts a state megatron's init_state_fn filled (exp_avg, exp_avg_sq, no `step`) at step 0,
    as its own lazy init would have; the update is torch's."""

    @torch.no_grad()
    def step(self, closure=None):
        for state in self.state.values():
            if state and "step" not in state:
                state["step"] = torch.tensor(0.0)
        return super().step(closure)


class _CpuStream:
    """torch.cuda.Stream on cpu: work is already ordered, so waiting, recording and synchronising do nothing."""

    def __init__(self, *_args, **_kwargs):
        pass

    @staticmethod
    def current(*_args, **_kwargs) -> _CpuStream:
        return _DEFAULT_STREAM

    def wait_stream(self, _other) -> None:
        pass

    def record_event(self, *_args) -> _CpuStream:
        return self  # an event's synchronize() and a stream's are both nothing to wait for

    def synchronize(self) -> None:
        pass


_DEFAULT_STREAM = _CpuStream()


def _apply(patches: list) -> list[str]:
    """Set each (owner, name, value), appending the originals to the record; returns `installed()`."""
    record = tuple((owner, name, getattr(owner, name, _ABSENT)) for owner, name, _ in patches)
    for owner, name, value in patches:
        setattr(owner, name, value)
    setattr(torch.cuda, _RECORD, getattr(torch.cuda, _RECORD, ()) + record)
    return installed()


def _applied(suffix: str) -> bool:
    """A patched callable whose name ends with `suffix` is installed."""
    return any(name.endswith(suffix) for name in installed())


def installed() -> list[str]:
    """Names of the patched callables, e.g. 'torch.cuda.current_device' (empty when not installed)."""
    return [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in getattr(torch.cuda, _RECORD, ())]


def uninstall() -> None:
    """Restore every patched attribute (for tests; a worker process never needs it)."""
    for owner, name, original in reversed(getattr(torch.cuda, _RECORD, ())):
        if original is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    if hasattr(torch.cuda, _RECORD):
        delattr(torch.cuda, _RECORD)


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
