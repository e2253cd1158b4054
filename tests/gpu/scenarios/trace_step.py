"""The tracer's step on CUDA input ids: NANSCOPE_TRACE_STEP names the op, sample and token on the device.

    python -m tests.gpu.scenario trace_step OUT.json

One process on cuda:0 (tests/gpu/single.py), the tiny Qwen3-MoE in bf16 under the DistributedOptimizer, the plugin's
hook in raise mode with trace_step 1:0 and slime's --load-debug-rollout-data (the rollouts saved as slime's
--save-debug-rollout-data writes them: CPU tensors in a .pt file). Rollout 0 is healthy, rollout 1 the case's
kl-exp-overflow: its training forward receives CUDA input ids, which the tracer matches against the dump's tokens
on one device (trace/tracer/step.py), then megatron's check ends the step as without nanscope. Records the error,
the hazard's site and the trace file the step wrote.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.gpu import single


def main(out: dict, argv: list[str]) -> None:
    from nanscope import case, slime_plugin
    from nanscope.megatron import step
    from nanscope.megatron.sizes import TinyQwen3MoE
    from nanscope.slime_plugin.settings import Settings

    out["shims"] = single.start()
    sizes = TinyQwen3MoE()
    chunks, optimizer, scheduler = single.build(sizes, distributed=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = case.args(global_batch_size=8)
        args.load_debug_rollout_data = str(Path(tmp) / "rollout_data" / "{rollout_id}.pt")
        slime_plugin.configure(Settings(report_dir=str(Path(tmp) / "reports"), trace_step=(1, 0)))
        out["error"] = None
        for rollout_id, hazard in enumerate(("healthy", "kl-exp-overflow")):
            batch, site = single.batch(chunks, sizes, hazard, seed=1 + rollout_id, n_samples=8)
            path = Path(args.load_debug_rollout_data.format(rollout_id=rollout_id))
            path.parent.mkdir(parents=True, exist_ok=True)
            step.save_rollout(str(path), batch, rollout_id)
            out["input_ids_device"] = str(batch["unconcat_tokens"][0].device)
            try:
                single.step(chunks, optimizer, scheduler, batch, args, hook=slime_plugin, rollout_id=rollout_id)
            except RuntimeError as e:
                out["error"] = str(e)
                break
        out["site"] = list(site) if site is not None else None
        out["reports"] = [Path(r).name for r in slime_plugin.reports()]
        traces = [r for r in slime_plugin.reports() if r.endswith(".trace.json")]
        out["trace"] = json.loads(Path(traces[0]).read_text()) if traces else None
        slime_plugin.uninstall()
