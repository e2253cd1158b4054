"""The plugin's step on CUDA: its synchronizing calls, skip mode under both of the case's optimizers, its cost.

    python -m tests.gpu.scenario plugin_step OUT.json [--rounds N]

One process on cuda:0 (tests/gpu/single.py: NCCL world 1, real megatron-core, no CPU layer, te_less where TE is
absent), slime v0.1.0's train_one_step (`nanscope.megatron.chunked`), in bf16:

- cost: a model big enough that kernel launches do not decide the ratio (8 layers, hidden 1,024, 8 experts top-2,
  8 samples of about 512 tokens: 4k tokens a step), DistributedOptimizer, slime's own loss. Alternating blocks of
  steps with the hook installed (raise mode; its first step, the installation, untimed) and without it; the median
  step time of each and the peak memory megatron's allocator reached (`torch.cuda.max_memory_allocated`);
- syncs: a healthy step with the whole plugin (its loss, `--loss-type custom_loss`, and its hook) under
  `torch.cuda.set_sync_debug_mode("warn")`, each synchronizing call attributed by its stack (`single.SyncAudit`) to
  the plugin's code (slime_plugin/, trace/, loss/guard.py, loss/safe.py, loss/headroom.py) or the run's;
- skip: under the DistributedOptimizer and under the HybridDeviceOptimizer (--optimizer-cpu-offload
  --optimizer-offload-fraction 1 --use-precision-aware-optimizer, as the case), a step with a NaN planted in
  decoder.layers.1.mlp's forward in skip mode: the model's parameters, the fp32 main parameters and Adam's state
  (every tensor the optimizer holds: `single.optimizer_tensors`) bitwise unchanged, the step counted as skipped.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tests.gpu import single

PLUGIN = ("/nanscope/slime_plugin/", "/nanscope/trace/", "/nanscope/loss/guard.py", "/nanscope/loss/safe.py",
          "/nanscope/loss/headroom.py")  # fmt: skip
MiB = 1024 * 1024


def cost_sizes():
    from nanscope.megatron.sizes import TinyQwen3MoE

    return TinyQwen3MoE(num_layers=8, hidden_size=1024, num_attention_heads=16, num_query_groups=4, kv_channels=64,
                        moe_ffn_hidden_size=1024, num_experts=8, moe_router_topk=2, vocab_size=32768,
                        max_sequence_length=2048)  # fmt: skip


def main(out: dict, argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    out["shims"] = single.start()
    with tempfile.TemporaryDirectory() as tmp:
        out["cost"] = cost(Path(tmp), a.rounds)
        out["distributed"] = audit_and_skip(Path(tmp) / "distributed", cpu_offload=False)
        out["hybrid"] = audit_and_skip(Path(tmp) / "hybrid", cpu_offload=True)


def _timed(fn) -> tuple[float, int]:
    """(seconds, peak bytes allocated) of one call, the device idle before and after."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, torch.cuda.max_memory_allocated()


def cost(tmp: Path, rounds: int, per_block: int = 3) -> dict:
    """The hook's time and peak-memory cost on healthy steps, hooked and plain blocks alternating."""
    from nanscope import case, slime_plugin
    from nanscope.slime_plugin.settings import Settings

    sizes = cost_sizes()
    chunks, optimizer, scheduler = single.build(sizes, distributed=True)
    batch, _ = single.batch(chunks, sizes, "healthy", seed=1, n_samples=8, scale=14)
    args = case.args(global_batch_size=8)
    plain = lambda: single.step(chunks, optimizer, scheduler, batch, args)  # noqa: E731
    hooked = lambda: single.step(chunks, optimizer, scheduler, batch, args, hook=slime_plugin)  # noqa: E731
    for _ in range(2):  # warm-up: kernels chosen, allocator's pools grown
        _timed(plain)
    times, peaks = {"plain": [], "hooked": []}, {"plain": [], "hooked": []}
    for _ in range(rounds):
        slime_plugin.configure(Settings(report_dir=str(tmp / "cost")))
        _timed(hooked)  # the installation on the chunks: once a job
        for _ in range(per_block):
            t, m = _timed(hooked)
            times["hooked"].append(t)
            peaks["hooked"].append(m)
        slime_plugin.uninstall()
        for _ in range(per_block):
            t, m = _timed(plain)
            times["plain"].append(t)
            peaks["plain"].append(m)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "sizes": {k: getattr(sizes, k) for k in ("num_layers", "hidden_size", "num_experts", "vocab_size")},
        "tokens": sum(batch["total_lengths"]),
        "median_s": median,
        "time_ratio": median["hooked"] / median["plain"],
        "peak_bytes": {k: max(v) for k, v in peaks.items()},
        "peak_extra_bytes": max(peaks["hooked"]) - max(peaks["plain"]),
        "steps": {k: len(v) for k, v in times.items()},
    }


def audit_and_skip(tmp: Path, *, cpu_offload: bool) -> dict:
    """The whole plugin's synchronizing calls on a healthy step, then a skipped step's effect on every tensor."""
    from nanscope import case, slime_plugin
    from nanscope.facts import paths
    from nanscope.megatron import faults
    from nanscope.megatron.sizes import TinyQwen3MoE
    from nanscope.slime_plugin.settings import Settings
    from nanscope.trace.sentinels.observe import layer_offset

    sizes = TinyQwen3MoE()
    chunks, optimizer, scheduler = single.build(sizes, distributed=True, cpu_offload=cpu_offload)
    fired = {"on": False}
    faults.plant(
        chunks[0], faults.Fault("decoder.layers.1.mlp", "forward", "nan"), layer_offset(chunks), lambda: fired["on"]
    )
    batch, _ = single.batch(chunks, sizes, "healthy", seed=1, n_samples=8)
    args = case.args(global_batch_size=8)
    args.loss_type, args.custom_loss_function_path = "custom_loss", paths.LOSS_FUNCTION_PATH  # README line 1
    slime_plugin.configure(Settings(report_dir=str(tmp / "reports"), on_nonfinite="skip"))

    def train(rollout_id: int):
        return single.step(chunks, optimizer, scheduler, batch, args, hook=slime_plugin, rollout_id=rollout_id)

    result = {"healthy": [float(train(0)[0])]}  # installs the hook; the optimizer's state exists from here on
    with single.SyncAudit() as audit:
        result["healthy"].append(float(train(1)[0]))
    result["plugin_syncs"] = audit.by(PLUGIN)
    result["syncs"] = len(audit.stacks)
    params, held = single.parameters(chunks), single.optimizer_tensors(optimizer)
    fired["on"] = True
    grad_norm, ok = train(2)
    fired["on"] = False
    result["skipped_grad_norm"], result["updated"] = float(grad_norm), bool(ok)
    result["skipped"] = slime_plugin.skipped_steps()
    result["params_changed"] = single.changed(params, single.parameters(chunks))
    result["optimizer_tensors"] = len(held)
    result["optimizer_changed"] = single.changed(held, single.optimizer_tensors(optimizer))
    result["optimizer_kinds"] = sorted({type(o).__name__ for o in _optimizers(optimizer)})
    params, held = single.parameters(chunks), single.optimizer_tensors(optimizer)
    result["after"] = float(train(3)[0])  # the run goes on: a healthy step updates again, and the check sees it
    result["params_changed_after"] = len(single.changed(params, single.parameters(chunks)))
    result["optimizer_changed_after"] = len(single.changed(held, single.optimizer_tensors(optimizer)))
    result["reports"] = [Path(r).name for r in slime_plugin.reports()]
    slime_plugin.uninstall()
    return result


def _optimizers(optimizer) -> list:
    """megatron's optimizer and every optimizer inside it (ChainedOptimizer, inner, sub-optimizers)."""
    found, todo = [], [optimizer]
    while todo:
        opt = todo.pop()
        found.append(opt)
        todo += list(getattr(opt, "chained_optimizers", ())) + list(getattr(opt, "sub_optimizers", ()))
        inner = getattr(opt, "optimizer", None)
        if inner is not None and inner is not opt:
            todo.append(inner)
    return found
