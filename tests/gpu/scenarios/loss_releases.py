"""The plugin's loss through one slime release's own loss_function and metric packing, on CUDA.

    NANSCOPE_SLIME_SRC=DIR python -m tests.gpu.scenario loss_releases OUT.json --release v0.2.4

DIR holds one slime checkout per release (v0.1.0/, v0.2.4/, v0.3.1/, main/): ../shared/slime-src does not travel to
a GPU machine, so the device script copies it and names the copy. One process, world of 1 over NCCL, megatron-core's
parallel state (TP 1, CP 1); the release's loss module imported from the checkout as the offline replay does
(`nanscope.trace.bundles.slime_import.checkout_loss`). Every tensor of the batch on the GPU, as slime's is.

Per configuration (`CONFIGS`: four of tests/slime_releases/packing_worker.py's, which runs them all on CPU: healthy
and a hazard, --recompute-loss-function on and off where the release has it), after a warm-up of each variant, one forward + backward of the release's `loss_function` under
torch.cuda.set_sync_debug_mode("warn"), each synchronizing call with the file:line that made it:

    own       --loss-type policy_loss
    alone     the plugin's loss without the hook: its nan_guard/* among the metrics (slime's packing reads each)
    hooked    the plugin's loss with the hook's record of the step open (`loss_watch.LossWatch`, as the installed
              hook keeps it): the counters on the record, the metrics the release's own

and whether the plugin's loss and gradient equal the release's own (healthy) or are finite (hazards).
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import types
from pathlib import Path

from tests.gpu.scenarios.loss_cuda import count_syncs

CONFIGS = ("case-flags", "recompute-loss-function", "nan-rollout-logprob", "recompute kl-exp-overflow")


def on_device(batch: dict, device) -> dict:
    import torch

    def moved(x):
        return x.to(device) if isinstance(x, torch.Tensor) else x

    return {k: [moved(x) for x in v] if isinstance(v, list) else moved(v) for k, v in batch.items()}


def call(module, args, batch, full):
    """One forward + backward of the release's loss_function: (loss, d loss / d logits, metric keys, values)."""
    import inspect

    x = full.detach().clone().requires_grad_(True)
    extra = (8,) if "step_global_batch_size" in inspect.signature(module.loss_function).parameters else ()
    loss, _, log = module.loss_function(args, batch, 1, *extra, x)
    loss.backward()
    return loss.detach(), x.grad, list(log["keys"]), log["values"].detach()


def variant(module, args, batch, full) -> tuple[list[str], tuple]:
    """(where each sync of one counted call was made, the call's result), after a warm-up call."""
    call(module, args, copy.deepcopy(batch), full)
    fresh = copy.deepcopy(batch)  # outside the count: slime hands the loss a batch it built
    result = []
    found = count_syncs(lambda: result.append(call(module, args, fresh, full)))
    return found, result[0]


def evaluate(module, release: str, cfg, device) -> dict:
    import torch

    from nanscope.loss import target as targets
    from nanscope.slime_plugin import state
    from nanscope.slime_plugin.loss_watch import LossWatch
    from tests.slime_releases import worker

    args = argparse.Namespace(**{**worker.release_defaults(release), **cfg.flags})
    plugin_args = copy.copy(args)
    plugin_args.loss_type, plugin_args.custom_loss_function_path = "custom_loss", worker.PLUGIN
    cpu_batch, cpu_full = worker.build_batch(cfg)
    batch, full = on_device(cpu_batch, device), cpu_full.to(device)
    own = variant(module, args, batch, full)
    alone = variant(module, plugin_args, batch, full)
    watch = LossWatch(targets.running())
    state.installation().hook = types.SimpleNamespace(losses=watch)
    try:
        hooked = variant(module, plugin_args, batch, full)
    finally:
        state.installation().hook = None
        watch.remove()
    finite = lambda r: bool(torch.isfinite(r[0]) and torch.isfinite(r[1]).all() and torch.isfinite(r[3]).all())  # noqa: E731
    return {
        "hazard": cfg.hazard, "syncs": {"own": own[0], "alone": alone[0], "hooked": hooked[0]},
        "keys": {"own": own[1][2], "alone": alone[1][2], "hooked": hooked[1][2]},
        "hooked_equals_own": bool(own[1][0].equal(hooked[1][0]) and own[1][1].equal(hooked[1][1])),
        "plugin_finite": finite(hooked[1]), "own_finite": finite(own[1]),
        "record": [s.counts.tolist() for s in watch.seen if s.counts is not None][-1:],
    }  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(out: dict, args: list[str]) -> None:
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="loss_releases")
    p.add_argument(
        "--release", required=True, help="v0.1.0, v0.2.4, v0.3.1 or main (a directory of NANSCOPE_SLIME_SRC)"
    )
    a = p.parse_args(args)
    checkout = Path(os.environ["NANSCOPE_SLIME_SRC"]) / a.release
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps

    from nanscope.loss import target as targets
    from nanscope.trace.bundles import slime_import
    from tests.slime_releases import packing_worker, worker

    ps.initialize_model_parallel()
    try:
        with slime_import.checkout_loss(checkout) as module:
            release = targets.identify().name.split(" ")[0]
            out["release"], out["checkout"] = release, str(checkout)
            out["configs"] = {
                cfg.name: evaluate(module, release, cfg, device)
                for cfg in packing_worker.CONFIGS
                if cfg.name in CONFIGS and worker.ORDER.index(cfg.since) <= worker.ORDER.index(release)
            }
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()
