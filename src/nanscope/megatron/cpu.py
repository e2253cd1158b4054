"""Run megatron-core 0.15.0rc0 on CPU over gloo: the one place the harness patches megatron or torch.

`install()` redirects megatron-core's CUDA-only calls to CPU, for the whole process; `install_slime()` adds those of
slime's own train actor, `install_driver()` the one of slime's driver (`nanscope repro --slime-src`). Each patch in
their lists names the CUDA-only call it replaces; the stand-ins live beside this module, by what they replace:
- `cpu_cuda.py`: torch.cuda and torch's CUDA-only tensor calls (devices, streams, memory, pinned factories);
- `cpu_distributed.py`: torch.distributed (gloo for nccl), and `agree_on_grad_check(ctx)`, one run's DDP model's
  finish_grad_sync, so that the ranks that passed megatron's gradient check learn that a peer failed it;
- `cpu_megatron.py`: megatron-core (the RNG tracker, recompute's CUDA generator, the alltoall split sizes, Adam),
  and `compile_on_first_call()`: torch.compile deferred to a first call while megatron-core is imported
  (`bootstrap.import_megatron`).
The slime plugin, on the real GPUs, wraps only the model chunks and the optimizer slime hands its hook
(`slime_plugin/watch.py`): none of this is applied there.

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

from nanscope.megatron import cpu_cuda, cpu_distributed, cpu_megatron

# While installed, the record of `install`'s patches, ((owner, attribute name, original value), ...) in
# the order applied, is kept on the first patched module (torch.cuda), for `installed` and `uninstall`.
_RECORD = "_nanscope_cpu_patches"
_ABSENT = object()  # the original of an attribute that did not exist (te_general_gemm without TE)


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
        (torch.cuda, "current_device", cpu_cuda.cpu_device),
        # torch.tensor(..., device='cuda'): scalars in the optimizer and RerunStateMachine -> cpu.
        (torch, "tensor", cpu_cuda.on_cpu(torch.tensor)),
        # torch.zeros(..., device='cuda'): token counters in the schedules -> cpu.
        (torch, "zeros", cpu_cuda.on_cpu(torch.zeros)),
        # torch.ones(..., device='cuda'): the default causal mask of the local attention -> cpu.
        (torch, "ones", cpu_cuda.on_cpu(torch.ones)),
        # Tensor.cuda(): megatron moves scalars/buffers to the GPU -> stay on cpu.
        (torch.Tensor, "cuda", cpu_cuda.tensor_cuda),
        # Tensor.type(): the optimizer asserts 'torch.cuda.FloatTensor' / 'torch.cuda.BFloat16Tensor'
        # for params and grads -> cpu tensors report their CUDA type name.
        (torch.Tensor, "type", cpu_cuda.cuda_type_name),
        # torch.cuda.synchronize(): nothing to wait for on cpu.
        (torch.cuda, "synchronize", lambda *a, **k: None),
        # CudaRNGStatesTracker.add: torch.cuda.manual_seed/get_rng_state -> a cpu generator state.
        (mp_random.CudaRNGStatesTracker, "add", cpu_megatron.CpuRngTracker.add),
        # CudaRNGStatesTracker.fork: swaps the CUDA rng state -> swaps the cpu rng state.
        (mp_random.CudaRNGStatesTracker, "fork", cpu_megatron.CpuRngTracker.fork),
        # Activation recompute (--recompute-granularity full): random.py:41 _get_cuda_rng_state,
        # torch.cuda.random.get_rng_state -> an empty state (no CUDA generator on CPU).
        (mp_random, "_get_cuda_rng_state", cpu_megatron.CpuRecomputeRng.get_state),
        # Activation recompute: random.py:72 _set_cuda_rng_state, the CUDA default generator's set_state -> nothing.
        (mp_random, "_set_cuda_rng_state", cpu_megatron.CpuRecomputeRng.set_state),
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
        (dist, "init_process_group", cpu_distributed.gloo(dist.init_process_group)),
        # torch.empty_like(..., pin_memory=True) (actor.py:122, the cpu copies of the weights) -> unpinned.
        (torch, "empty_like", cpu_cuda.unpinned(torch.empty_like)),
        # torch.cuda.Stream() (moe/token_dispatcher.py:424, the alltoall dispatcher's DtoH stream) -> a cpu stand-in.
        (torch.cuda, "Stream", cpu_cuda.CpuStream),
        # torch.cuda.current_stream() (token_dispatcher.py:830, :832) -> the one cpu stand-in stream.
        (torch.cuda, "current_stream", cpu_cuda.CpuStream.current),
        # torch.cuda.stream(s) (token_dispatcher.py:833) -> no stream to switch to.
        (torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext()),
        # maybe_move_tensor_to_cpu (moe_utils.py:850, bound in token_dispatcher.py:26): the alltoall split sizes' DtoH
        # copy, numpy for all_to_all_single, skipped for a tensor that is not on CUDA -> a cpu tensor converted too.
        (token_dispatcher, "maybe_move_tensor_to_cpu", cpu_megatron.split_sizes_to_host),
        # (the CUDA generator's save and restore under activation recompute, random.py:41 and :72: install()'s)
        # torch.cuda.get_rng_state() (Megatron-LM training/checkpointing.py:320, every save_checkpoint, even with
        # --no-save-rng) -> an empty state, as under recompute.
        (torch.cuda, "get_rng_state", cpu_megatron.CpuRecomputeRng.get_state),
        # torch.cuda.mem_get_info(device) (slime's memory_utils.available_memory: v0.3.1 memory_utils.py:21, at every
        # actor's init; v0.1.0 memory_utils.py:13, under --offload) -> the host's free and total memory.
        (torch.cuda, "mem_get_info", cpu_cuda.host_memory),
        # torch.cuda.memory_allocated(device) (v0.3.1 memory_utils.py:28) -> 0: no CUDA allocator holds anything.
        (torch.cuda, "memory_allocated", lambda *a, **k: 0),
        # torch.cuda.memory_reserved(device) (v0.3.1 memory_utils.py:29) -> 0, as memory_allocated.
        (torch.cuda, "memory_reserved", lambda *a, **k: 0),
        # Adam (optimizer/__init__.py:11-25): TransformerEngine's or Apex's FusedAdam, a CUDA kernel; without them
        # torch's AdamW, whose state needs a `step` that init_state_fn (:376-383, which slime calls eagerly,
        # model.py:142-145) never writes -> torch's AdamW, given the `step` its own init would write (0).
        (mp_optimizer, "Adam", cpu_megatron.AdamWAfterInitState),
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
        (torch.cuda, "get_device_properties", cpu_cuda.h100_properties),
    ]
    return _apply(patches)


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
