"""One process on the current CUDA device (NCCL, world 1), real megatron-core without the CPU layer: what the GPU
tier's scenarios build on.

    group = single.start()                                   # te_less shims where TE is absent, NCCL, parallel state
    chunks, optimizer, scheduler = single.build(sizes, distributed=True, cpu_offload=False)
    batch, site = single.batch(chunks, sizes, "kl-exp-overflow", seed=1, n_samples=8)
    grad_norm, ok = single.step(chunks, optimizer, scheduler, batch, args, seq, hook=slime_plugin)

Each scenario calls `start` once in its own process (`tests/gpu/scenario.py`).
"""

from __future__ import annotations

import os
import warnings

import torch


def start() -> list[str]:
    """megatron-core on cuda:0 in a world of one (NCCL); returns the te_less shims applied."""
    import torch.distributed as dist

    from nanscope.megatron import bootstrap, te_less

    shims = te_less.apply()
    bootstrap.import_megatron()  # megatron-core only: no CPU layer, the real CUDA calls
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    torch.cuda.set_device(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(bootstrap.free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    mpu.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    return shims


def build(sizes, *, distributed: bool = True, cpu_offload: bool = False, seed: int = 0):
    """The model's chunks in bf16 on the device, megatron's optimizer (the DistributedOptimizer, or over the
    HybridDeviceOptimizer with `cpu_offload`), the scheduler, wired as slime's train step wires them."""
    from megatron.core.distributed import finalize_model_grads

    from nanscope.megatron import chunked, model

    training = model.Training(distributed_optimizer=distributed)
    chunks, config = model.build_chunks(sizes, seed=seed, bf16=True, training=training, cuda=True)
    optimizer = model.build_optimizer(chunks, bf16=True, distributed=distributed, cpu_offload=cpu_offload)
    config.finalize_model_grads_func, config.grad_scale_func, config.timers = (
        finalize_model_grads,
        optimizer.scale_loss,
        None,
    )
    return chunks, optimizer, chunked.lr_schedule(optimizer)


def seq_length(batch: dict) -> int:
    from nanscope.megatron import step

    return step.seq_length_for(batch["total_lengths"], 1)


def batch(chunks, sizes, hazard: str, *, seed: int, n_samples: int, scale: int = 1) -> tuple[dict, tuple | None]:
    """A case-shaped rollout of `n_samples` built against the model (slime's log-prob pass on the device), its
    tensors on the device; and the hazard's site (sample, response position), None for a healthy batch."""
    from nanscope import case, hazards
    from nanscope.megatron import chunked, step

    rollout = case.rollout(sizes.vocab_size, seed, n_samples=n_samples, scale=scale)
    run = chunked.log_prob_pass(chunks, step.seq_length_for(rollout.total_lengths, 1), sizes.vocab_size)
    built = hazards.build(hazard, lambda ts: [x.cpu() for x in run([t.cuda() for t in ts])], rollout, seed)
    site = built.pop("hazard_site", None)
    on_device = {k: [x.cuda() if isinstance(x, torch.Tensor) else x for x in v] for k, v in built.items()}
    return on_device, site


def step(chunks, optimizer, scheduler, batch: dict, args, *, hook=None, rollout_id: int = 0):
    """slime v0.1.0's train_one_step (`chunked.train_one_step`): (grad norm, whether the optimizer updated)."""
    from nanscope.megatron import chunked

    return chunked.train_one_step(chunks, optimizer, scheduler, batch, args=args, seq_length=seq_length(batch),
                                  hook=hook, rollout_id=rollout_id)  # fmt: skip


def optimizer_tensors(optimizer) -> dict[str, torch.Tensor]:
    """Copies of every tensor megatron's optimizer updates: through a ChainedOptimizer and a MixedPrecision or
    DistributedOptimizer down to the torch optimizers (the fp32 main parameters are their parameters) and a
    HybridDeviceOptimizer's sub-optimizers (its fp32 copies on the host), each parameter and its state (Adam's
    exp_avg, exp_avg_sq, step)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(opt, prefix: str) -> None:
        for i, sub in enumerate(getattr(opt, "chained_optimizers", ())):
            walk(sub, f"{prefix}chain{i}.")
        inner = getattr(opt, "optimizer", None)
        if inner is not None and inner is not opt:
            walk(inner, f"{prefix}inner.")
        if not isinstance(opt, torch.optim.Optimizer):
            return
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                if id(p) not in seen:
                    seen.add(id(p))
                    out[f"{prefix}{g}.{i}"] = p.detach().clone()
                for key, value in opt.state.get(p, {}).items():
                    if torch.is_tensor(value):
                        out[f"{prefix}{g}.{i}.{key}"] = value.detach().clone()
        for i, sub in enumerate(getattr(opt, "sub_optimizers", ())):
            walk(sub, f"{prefix}sub{i}.")

    walk(optimizer, "")
    return out


def parameters(chunks) -> dict[str, torch.Tensor]:
    return {f"{c}.{n}": p.detach().clone() for c, chunk in enumerate(chunks) for n, p in chunk.named_parameters()}


def changed(before: dict, after: dict) -> list[str]:
    """The names whose tensors differ (bitwise) between two snapshots."""
    return sorted(k for k in before if k not in after or not torch.equal(before[k], after[k]))


class SyncAudit:
    """Within the block, each synchronizing CUDA call is recorded with the Python stack that made it
    (`torch.cuda.set_sync_debug_mode("warn")`: torch warns at each; the warning's hook takes the stack).

    `by(prefixes)`: the calls whose innermost decisive frame is under one of `prefixes`, as "file:line"; a frame is
    decisive unless it is torch's own or one of `NEUTRAL` (nanscope helpers that both the run and the plugin call).
    """

    NEUTRAL = ("/nanscope/loss/microbatch.py", "/nanscope/loss/formulas.py", "/nanscope/loss/layout.py")

    def __init__(self):
        self.stacks: list[list[tuple[str, int]]] = []

    def __enter__(self) -> SyncAudit:
        import traceback

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message):
                self.stacks.append([(f.filename, f.lineno) for f in traceback.extract_stack()[:-1]])
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        self._catch.__exit__(*exc)

    def decisive(self, stack: list[tuple[str, int]]) -> tuple[str, int] | None:
        for filename, lineno in reversed(stack):
            if "/torch/" in filename or filename.endswith(self.NEUTRAL) or "/warnings.py" in filename:
                continue
            return filename, lineno
        return None

    def by(self, prefixes: tuple[str, ...]) -> list[str]:
        out = []
        for stack in self.stacks:
            frame = self.decisive(stack)
            if frame is not None and any(p in frame[0] for p in prefixes):
                out.append(f"{frame[0].split('/nanscope/')[-1]}:{frame[1]}")
        return sorted(out)
