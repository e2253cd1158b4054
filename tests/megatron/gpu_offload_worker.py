"""One GPU, one process (NCCL, world 1): the plugin over the case's CPU-offloaded optimizer, no CPU layer.

    python tests/megatron/gpu_offload_worker.py OUT_DIR

The tiny Qwen3-MoE in bf16 on the current CUDA device (megatron's DDP with the distributed optimizer), megatron's
HybridDeviceOptimizer (--optimizer-cpu-offload --optimizer-offload-fraction 1 --use-precision-aware-optimizer, as
the case; model.build_optimizer), slime v0.1.0's train_one_step (`nanscope.megatron.chunked`), the hook in skip
mode over slime's own loss. Three steps: healthy (the hook installs), healthy under
torch.cuda.set_sync_debug_mode("warn") (each synchronizing CUDA call a warning, attributed by its file to the
plugin or the run), and one with a NaN planted in decoder.layers.1.mlp's forward: skipped, the parameters the
offloaded optimizer holds unchanged. Writes OUT_DIR/result.json.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

PLUGIN = ("/nanscope/slime_plugin/", "/nanscope/trace/", "/nanscope/loss/headroom.py")


def main(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from nanscope import case, hazards, slime_plugin
    from nanscope.megatron import bootstrap, chunked, faults, model, step
    from nanscope.slime_plugin.settings import Settings
    from nanscope.trace.sentinels.observe import layer_offset

    bootstrap.import_megatron()  # megatron-core only: no CPU layer, the real CUDA calls
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.distributed import finalize_model_grads

    torch.cuda.set_device(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(bootstrap.free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    mpu.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    training = model.Training(distributed_optimizer=True)
    chunks, config = model.build_chunks(seed=0, bf16=True, training=training, cuda=True)
    optimizer = model.build_optimizer(chunks, bf16=True, distributed=True, cpu_offload=True)
    config.finalize_model_grads_func, config.grad_scale_func, config.timers = (
        finalize_model_grads,
        optimizer.scale_loss,
        None,
    )
    scheduler = chunked.lr_schedule(optimizer)
    vocab = model.TinyQwen3MoE().vocab_size
    rollout = case.rollout(vocab, 5, n_samples=4)
    seq = step.seq_length_for(rollout.total_lengths, 1)
    run = chunked.log_prob_pass(chunks, seq, vocab)
    batch = hazards.build("healthy", lambda ts: [x.cpu() for x in run([t.cuda() for t in ts])], rollout, 5)
    batch.pop("hazard_site", None)
    batch = {k: [x.cuda() if isinstance(x, torch.Tensor) else x for x in v] for k, v in batch.items()}
    slime_plugin.configure(Settings(report_dir=str(out / "reports"), on_nonfinite="skip"))
    args = case.args(global_batch_size=4)
    fired = {"on": False}
    faults.plant(
        chunks[0], faults.Fault("decoder.layers.1.mlp", "forward", "nan"), layer_offset(chunks), lambda: fired["on"]
    )

    def train():
        return chunked.train_one_step(chunks, optimizer, scheduler, batch, args=args, seq_length=seq, hook=slime_plugin)

    result = {"healthy": float(train()[0])}
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result["audited"] = float(train()[0])
        torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    result["plugin_syncs"] = sorted(f"{w.filename}:{w.lineno}" for w in syncs if any(p in w.filename for p in PLUGIN))
    result["run_syncs"] = sum(1 for w in syncs if not any(p in w.filename for p in PLUGIN))
    before = {n: p.detach().clone() for n, p in chunks[0].named_parameters()}
    fired["on"] = True
    grad_norm, ok = train()
    result["skipped_grad_norm"], result["skipped"] = float(grad_norm), slime_plugin.skipped_steps()
    result["params_unchanged"] = all(torch.equal(before[n], p) for n, p in chunks[0].named_parameters())
    result["reports"] = slime_plugin.reports()
    (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
