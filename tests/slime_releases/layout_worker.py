"""torchrun worker (2 processes, gloo): the layout matrix through slime v0.1.0's own train() and train_one_step.

    python -m torch.distributed.run --nproc-per-node 2 tests/slime_releases/layout_worker.py \\
        --slime-src ../shared/slime-src/v0.1.0 --group dp2|pp2-vpp2 --out DIR

What runs is slime's (`setup_model_and_optimizer`: megatron's DDP from slime's DDP config and its distributed
optimizer; `get_data_iterator`: one DataIterator per virtual stage; `train()`: the overlapped reduce's no_sync and
grad_sync wiring, finalize_model_grads; `train_one_step`: the zeroing, the hook, megatron's schedule, slime's
loss_function, its --no-check-for-nan-in-loss-and-grad path, the optimizer and scheduler steps), over the stand-ins of
train_worker.py (megatron.training's names; get_model builds one chunk per virtual stage, as Megatron-LM's does).
The hook is `--custom-megatron-before-train-step-hook-path nanscope.slime_plugin.before_train_step` over slime's own
loss. Layouts and modes are tests/megatron/layout_worker.py's (LAYOUTS here as slime's flags), a NaN planted in
one module's forward on one rank at the first rollout; each run trains [the faulty rollout, a healthy one], the
reference the healthy one alone. Each rank writes OUT/rank<R>.json as that worker does.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.*

from tests.megatron.layout_worker import FAULTS, MODES, finish, watched  # noqa: E402

SEEDS = (1, 3)  # the two rollouts (train_worker.SEEDS' healthy and later)
STEP_BOUND_S = 150.0
# layout -> slime's flags (their DDP and optimizer configs are read from these by name)
LAYOUTS = {
    "dp2": {"use_distributed_optimizer": True},
    "overlap-check": {"use_distributed_optimizer": True, "overlap_grad_reduce": True, "ddp_bucket_size": 20000},
    "overlap-nocheck": {
        "use_distributed_optimizer": True, "overlap_grad_reduce": True, "ddp_bucket_size": 20000,
        "check_for_nan_in_loss_and_grad": False,
    },
    "recompute": {"use_distributed_optimizer": True, "recompute_granularity": "full", "recompute_method": "uniform",
                  "recompute_num_layers": 1},
    "pp2-vpp2": {"use_distributed_optimizer": True, "virtual_pipeline_model_parallel_size": 2},
}  # fmt: skip


class Run:
    """One run's chunks, optimizer and scheduler from slime's setup_model_and_optimizer, and its rollouts."""

    def __init__(self, w, flags: dict):
        import torch
        from megatron.core import tensor_parallel

        self.w = w
        self.args = w.args(hook=True)
        vars(self.args).update(flags, global_batch_size=8)
        w.megatron_training.set_args(self.args)
        torch.manual_seed(0)
        tensor_parallel.model_parallel_cuda_manual_seed(0, force_reset_rng=True)
        self.model, self.optimizer, self.scheduler = w.slime.setup_model_and_optimizer(self.args)
        for chained in self.scheduler.optimizer.chained_optimizers:  # train_worker._torch_adam_step's reason
            from tests.slime_releases.train_worker import _torch_adam_step

            _torch_adam_step(chained.optimizer)

    def train(self, rollout_id: int, data: dict) -> dict:
        """slime's train() over one rollout: what its train_one_step returned, or what it raised."""
        slime = self.w.slime
        # slime's train() asserts config.no_sync_func is None under --overlap-grad-reduce, then sets it, at every
        # call, on the model's one config: its second call asserts (THUDM/slime#1779, every release here; the fix
        # under review, slime#2066, sets them once). A fresh call here, as the first one of a process.
        config = self.model[0].config
        config.no_sync_func = config.grad_sync_func = None
        data_iterator, num_microbatches = self.w.data.get_data_iterator(self.args, self.model, data)
        real, record, started = slime.train_one_step, {}, time.time()

        def train_one_step(*a, **k):  # observes only: slime's train() looks train_one_step up here
            loss, grad_norm = real(*a, **k)
            record.update(grad_norm=float(grad_norm))
            return loss, grad_norm

        slime.train_one_step = train_one_step
        try:
            slime.train(rollout_id, self.model, self.optimizer, self.scheduler, data_iterator, num_microbatches)
        except Exception as e:
            record.update(error=str(e), error_type=type(e).__name__, traceback=traceback.format_exc()[-3000:])
        finally:
            slime.train_one_step = real
        record.update(lr_steps=self.scheduler.num_steps, seconds=time.time() - started)
        return record


def rollouts(w, run: Run) -> list[dict]:
    """The two rollouts' data on this rank (slime v0.1.0's strided split over data-parallel ranks, data.py:117),
    built against the initial model (a skipped rollout leaves it so): one log-prob pass over the chunks."""
    import torch
    from megatron.core import parallel_state as mpu

    from nanscope import case, hazards
    from nanscope.megatron import chunked
    from nanscope.megatron.model import TinyQwen3MoE
    from tests.slime_releases.train_worker import SEQ

    vocab, found = TinyQwen3MoE().vocab_size, []
    dp, d = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    for seed in SEEDS:
        batch = hazards.build("healthy", chunked.log_prob_pass(run.model, SEQ, vocab), case.rollout(vocab, seed), seed)
        data = {
            "tokens": batch["unconcat_tokens"], "total_lengths": batch["total_lengths"],
            "response_lengths": batch["response_lengths"],
            "loss_masks": [m.to(torch.int) for m in batch["loss_masks"]], "log_probs": batch["log_probs"],
            "ref_log_probs": batch["ref_log_probs"], "rollout_log_probs": batch["rollout_log_probs"],
            "advantages": batch["advantages"],
        }  # fmt: skip
        found.append({k: v[d::dp] for k, v in data.items()})
    return found


def plant(run: Run, module: str, once: bool, step_of) -> None:
    """The NaN in `module`'s forward output, at the first rollout (its first call only if `once`)."""
    from nanscope.megatron import faults
    from nanscope.trace.sentinels.observe import layer_offset

    fault = faults.Fault(module, "forward", "nan", once=once)
    handles = [h for c in run.model for h in faults.plant(c, fault, layer_offset([c]), lambda: step_of() == 0)]
    assert handles, f"no {module} here"


def one_run(w, layout: str, mode: str, data: list[dict]) -> dict:
    """A fresh run in `mode` (its environment read by the plugin at its first step): its rollouts, its files."""
    import torch
    import torch.distributed as dist

    from nanscope import slime_plugin
    from tests.slime_releases.train_worker import plugin_state

    env, once = MODES.get(mode, MODES["skip"])
    w.plugin(f"{layout}/{mode}", **env)
    run = Run(w, LAYOUTS[layout])
    module, fault_rank = FAULTS["pp2-vpp2" if layout == "pp2-vpp2" else "dp2"]
    current = {"rollout": -1}
    if mode != "reference" and dist.get_rank() == fault_rank:
        plant(run, module, once, lambda: current["rollout"])
    steps = []
    for rollout_id in [1] if mode == "reference" else [0, 1]:
        current["rollout"] = rollout_id
        w.wd.arm(f"{layout} {mode} rollout {rollout_id}", STEP_BOUND_S)
        steps.append(run.train(rollout_id, data[rollout_id]))
        if "error" in steps[-1]:
            break
    params = {f"{k}.{n}": p.detach().float() for k, c in enumerate(run.model) for n, p in c.named_parameters()}
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(name.encode() + params[name].contiguous().numpy().tobytes())
    state = plugin_state()
    w.wandb_logged()
    slime_plugin.uninstall()
    return {"steps": steps, "reports": state["reports"], "skipped": state["skipped"], "checksum": digest.hexdigest(),
            "params_finite": all(bool(torch.isfinite(p).all()) for p in params.values()),
            "lr_steps": run.scheduler.num_steps}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slime-src", type=Path, required=True)
    p.add_argument("--group", choices=("dp2", "pp2-vpp2"), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default=None, help="LAYOUT or LAYOUT:MODE: run only that")
    a = p.parse_args()
    os.environ["TORCHDYNAMO_DISABLE"] = "1"  # v0.1.0's helpers are @torch.compile'd: run them eagerly
    import torch

    torch.set_num_threads(1)
    from nanscope.megatron import bootstrap
    from nanscope.megatron.watchdog import Watchdog

    pp = {"pp": 2, "vpp": 2} if a.group == "pp2-vpp2" else {}
    bootstrap.init(**pp, timeout_s=120, group_timeout_s=180)
    from tests.slime_releases.train_worker import Worker

    a.out.mkdir(parents=True, exist_ok=True)
    w = Worker(a.slime_src, a.out)
    w.wd = Watchdog(a.out, w.rank)
    results: dict = {}
    for layout in LAYOUTS if a.group == "dp2" else ("pp2-vpp2",):
        if layout == "pp2-vpp2" and a.group == "dp2":
            continue
        data = None
        for mode in ("reference", *MODES):
            if a.only is not None and a.only not in (layout, f"{layout}:{mode}"):
                continue
            if data is None:
                w.plugin(f"{layout}/batches")
                data = rollouts(w, Run(w, LAYOUTS[layout]))
            results.setdefault(layout, {})[mode] = watched(
                w, f"{layout} {mode}", lambda: one_run(w, layout, mode, data)
            )
    finish(w, a.out, results)


if __name__ == "__main__":
    main()
