"""torchrun worker (2 processes, gloo): the plugin over the layouts slime's flags make, through real megatron-core.

    python -m torch.distributed.run --nproc-per-node 2 tests/megatron/layout_worker.py --group dp2 --out DIR
    python -m torch.distributed.run --nproc-per-node 2 tests/megatron/layout_worker.py --group pp2-vpp2 --out DIR

The tiny Qwen3-MoE (fp32), megatron's distributed optimizer (slime always turns it on), slime v0.1.0's
train_one_step over the rank's chunks (`nanscope.megatron.chunked`), 4 one-sample micro-batches per step, an LR
schedule. A NaN is planted in one module's forward output on one rank (FAULTS), at step 1 of each run:

    dp2 group    TP 1, PP 1, DP 2: the fault on rank 1 (one data-parallel replica); the layouts dp2,
                 overlap-check (--overlap-grad-reduce, megatron's check on), overlap-nocheck (its check off:
                 --no-check-for-nan-in-loss-and-grad), recompute (--recompute-granularity full)
    pp2-vpp2     PP 2 with 2 virtual stages each (interleaved 1F1B): the fault in decoder.layers.2.mlp, the first
                 chunk of rank 0 that is not its first (the chunk megatron's finalize_model_grads reaches second)
    plugin-loss  (dp2 and pp2-vpp2) no fault: the plugin's loss over a batch with two NaN inputs (PLUGIN_LOSS)

Each layout runs every mode of MODES: [the faulty step, a healthy step] (raise modes end at the first), and a
reference run that trains the healthy step alone, without a fault: a skipped step must leave the next healthy
step bitwise equal to it. Every step is bounded by a watchdog (a hang ends the rank and leaves stuck.rank<R>.txt).
Each rank writes OUT/rank<R>.json: {layout: {mode: {"steps": [...], "reports", "skipped", "checksum", "stdout"}}}.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

SEEDS = (11, 12)  # the two steps' batches
SAMPLES = 4  # per step: one micro-batch each, split over the data-parallel replicas
STEP_BOUND_S = 150.0  # each step (with its rerun) on a loaded 2-core box
FAULTS = {"dp2": ("decoder.layers.1.mlp", 1), "pp2-vpp2": ("decoder.layers.2.mlp", 0)}  # module, rank
# mode -> (the plugin's environment, the fault fires once (a transient one) or at every call of step 1)
MODES = {
    "raise": ({"NANSCOPE_ON_NONFINITE": "raise", "NANSCOPE_RERUN": "on"}, False),
    "raise-norerun": ({"NANSCOPE_ON_NONFINITE": "raise", "NANSCOPE_RERUN": "off"}, False),
    "skip": ({"NANSCOPE_ON_NONFINITE": "skip", "NANSCOPE_RERUN": "on"}, False),
    "skip-norerun": ({"NANSCOPE_ON_NONFINITE": "skip", "NANSCOPE_RERUN": "off"}, False),
    "skip-transient": (
        {"NANSCOPE_ON_NONFINITE": "skip", "NANSCOPE_SKIP_ON": "transient", "NANSCOPE_RERUN": "on"},
        True,
    ),
}
# dp2 only: a report that cannot be written on the rank that saw the value (a disk that takes no file past 4 KiB:
# torch.save raises RuntimeError), in skip mode: a warning, and the step is skipped on every rank all the same
FULL_DISK = "skip-full-disk"
# dp2 only: the rerun runs out of memory (an OutOfMemoryError at its first forward, on every rank): the report and
# the bundle were written before it
RERUN_OOM = "rerun-oom"
# dp2 only: the catalogue's zero-token expert (decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan) in the
# first pass of step 1 only, under skip-on-transient: the rerun is finite, but a zero-token expert is not ruled out
ZERO_TOKEN = "zero-token"
# dp2 and pp2-vpp2: no fault; the plugin's loss (--loss-type custom_loss) over step 1's batch with a NaN rollout
# log-prob on a masked token (sample 1) and a NaN old log-prob on a trained one (sample 2): the guard's counters reach
# the logging rank once a step, summed over the replicas (nanscope/nan_guard/*), and both steps are finite
PLUGIN_LOSS = "plugin-loss"
EXTRA = {
    PLUGIN_LOSS: MODES["raise"],
    FULL_DISK: MODES["skip"],
    RERUN_OOM: MODES["raise"],
    ZERO_TOKEN: MODES["skip-transient"],
}


def layouts(group: str) -> dict:
    from nanscope.megatron.model import Training

    if group == "pp2-vpp2":
        return {"pp2-vpp2": Training(vpp=2, distributed_optimizer=True)}
    return {
        "dp2": Training(distributed_optimizer=True),
        "overlap-check": Training(distributed_optimizer=True, overlap_grad_reduce=True, bucket_size=20000),
        "overlap-nocheck": Training(
            distributed_optimizer=True, overlap_grad_reduce=True, bucket_size=20000, check_for_nan_in_grad=False
        ),
        "recompute": Training(distributed_optimizer=True, recompute=True),
    }


class Worker:
    def __init__(self, group: str, out: Path):
        import torch.distributed as dist

        from nanscope.megatron.watchdog import Watchdog

        self.group, self.out, self.rank = group, out, dist.get_rank()
        self.wd = Watchdog(out, self.rank)
        self.module, self.fault_rank = FAULTS["pp2-vpp2" if group == "pp2-vpp2" else "dp2"]
        self.batches = None  # the two steps' batches, from the initial model (a skipped step leaves it so)
        import torch.distributed as dist
        from megatron.core import parallel_state as mpu

        self.microbatches = SAMPLES // mpu.get_data_parallel_world_size()  # per replica, per pass
        assert dist.get_world_size() == 2

    def build(self, training):
        from nanscope.megatron import bootstrap, chunked

        chunks, config, optimizer = bootstrap.build_layout(seed=0, bf16=False, training=training)
        return chunks, optimizer, chunked.lr_schedule(optimizer)

    def make_batches(self, chunks) -> None:
        from nanscope import case, hazards
        from nanscope.megatron import chunked, step
        from nanscope.megatron.model import TinyQwen3MoE

        vocab = TinyQwen3MoE().vocab_size
        self.batches = []
        for seed in SEEDS:
            rollout = case.rollout(vocab, seed, n_samples=SAMPLES)
            self.seq = step.seq_length_for(rollout.total_lengths, 1)
            batch = hazards.build("healthy", chunked.log_prob_pass(chunks, self.seq, vocab), rollout, seed)
            batch.pop("hazard_site", None)
            self.batches.append(batch)

    def plant(self, chunks, step_of, once: bool, mode: str) -> None:
        """The NaN in the module's forward output on the fault rank, at step 1 (its first call only if `once`);
        RERUN_OOM and ZERO_TOKEN add theirs (see above)."""
        from nanscope.megatron import faults
        from nanscope.trace.sentinels.observe import layer_offset

        forwards = {"n": 0}  # step 1's training forwards of the first chunk: past the first pass's, the rerun's

        def count(module, args):
            if module.training and step_of() == 1:
                forwards["n"] += 1
                if mode == RERUN_OOM and forwards["n"] > self.microbatches:
                    raise torch_oom("CUDA out of memory (planted: the rerun's first forward)")

        chunks[0].register_forward_pre_hook(count)
        if self.rank != self.fault_rank:
            return
        first_pass = lambda: step_of() == 1 and forwards["n"] <= self.microbatches
        if mode == ZERO_TOKEN:
            fault = faults.parse("decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan")
            handles = faults.plant(chunks[0], fault, layer_offset(chunks[:1]), first_pass)
        else:
            fault = faults.Fault(self.module, "forward", "nan", once=once)
            handles = [h for c in chunks for h in faults.plant(c, fault, layer_offset([c]), lambda: step_of() == 1)]
        assert handles, f"rank {self.rank} holds no {fault.module}"

    def run(self, layout: str, training, mode: str) -> dict:
        """One run: fresh chunks from seed 0, the plugin configured for `mode`, its steps; what each rank saw."""
        import torch

        from nanscope import case, slime_plugin
        from nanscope.megatron import chunked
        from nanscope.slime_plugin.settings import Settings

        env, once = {**MODES, **EXTRA}.get(mode, MODES["skip"])
        chunks, optimizer, scheduler = self.build(training)
        if self.batches is None:
            self.make_batches(chunks)
        current = {"step": 0}
        if mode not in ("reference", PLUGIN_LOSS):
            self.plant(chunks, lambda: current["step"], once, mode)
        reports = self.out / "reports" / layout / mode
        slime_plugin.configure(Settings.from_env({**env, "NANSCOPE_REPORT_DIR": str(reports)}))
        args = case.args(global_batch_size=4)
        args.check_for_nan_in_loss_and_grad = training.check_for_nan_in_grad
        batches = self.batches[1:] if mode == "reference" else self.batches
        if mode == PLUGIN_LOSS:
            from nanscope.facts.paths import LOSS_FUNCTION_PATH

            args.loss_type, args.custom_loss_function_path = "custom_loss", LOSS_FUNCTION_PATH
            batches = [with_nans(self.batches[0]), self.batches[1]]
        steps = []
        for i, batch in enumerate(batches, start=1):
            current["step"] = i
            self.wd.arm(f"{layout} {mode} step {i}", STEP_BOUND_S)
            started = time.time()
            try:
                with self.full_disk(mode == FULL_DISK and i == 1):
                    grad_norm, ok = chunked.train_one_step(
                        chunks, optimizer, scheduler, batch, args=args, seq_length=self.seq, hook=slime_plugin,
                        rollout_id=i - 1,
                    )  # fmt: skip
                steps.append({"grad_norm": float(grad_norm), "ok": bool(ok), "seconds": time.time() - started})
            except Exception as e:
                steps.append({"error": str(e), "error_type": type(e).__name__, "seconds": time.time() - started,
                              "traceback": traceback.format_exc()[-3000:]})  # fmt: skip
                break
        params = {f"{k}.{n}": p.detach() for k, c in enumerate(chunks) for n, p in c.named_parameters()}
        digest = hashlib.sha256()
        for name in sorted(params):
            digest.update(name.encode() + params[name].contiguous().numpy().tobytes())
        result = {
            "steps": steps, "reports": slime_plugin.reports(), "skipped": slime_plugin.skipped_steps(),
            "checksum": digest.hexdigest(), "params_finite": all(bool(torch.isfinite(p).all()) for p in params.values()),
            "lr_steps": scheduler.num_steps, "logged": slime_plugin.logged(),
        }  # fmt: skip
        slime_plugin.uninstall()
        return result

    @contextlib.contextmanager
    def full_disk(self, on: bool):
        """On the fault rank: no file past 4 KiB (EFBIG, as a full disk's ENOSPC) while the block runs."""
        if not on or self.rank != self.fault_rank:
            yield
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, previous)


def with_nans(batch: dict) -> dict:
    """PLUGIN_LOSS's batch: sample 1's first masked token has a NaN rollout log-prob, sample 2's first trained token
    a NaN old log-prob."""
    out = {k: list(v) if isinstance(v, list) else v for k, v in batch.items()}
    for key, sample, masked in (("rollout_log_probs", 1, True), ("log_probs", 2, False)):
        values = out[key][sample].clone()
        values[int(((out["loss_masks"][sample] == 0) == masked).nonzero()[0])] = float("nan")
        out[key][sample] = values
    return out


def torch_oom(text: str):
    import torch

    return torch.OutOfMemoryError(text)


class Tee(io.TextIOBase):
    """stdout, also kept: the plugin's lines (`nanscope: ...`) go to stdout."""

    def __init__(self, stream):
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text):
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--group", choices=("dp2", "pp2-vpp2"), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default=None, help="LAYOUT or LAYOUT:MODE: run only that")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from nanscope.megatron import bootstrap

    pp = {"pp": 2, "vpp": 2} if a.group == "pp2-vpp2" else {}
    bootstrap.init(**pp, timeout_s=120, group_timeout_s=180)
    a.out.mkdir(parents=True, exist_ok=True)
    w = Worker(a.group, a.out)
    results: dict = {}
    for layout, training in layouts(a.group).items():
        modes = ["reference", *MODES] + (
            list(EXTRA) if layout == "dp2" else [PLUGIN_LOSS] if layout == "pp2-vpp2" else []
        )
        for mode in modes:
            if a.only is None or a.only in (layout, f"{layout}:{mode}"):
                results.setdefault(layout, {})[mode] = watched(
                    w, f"{layout} {mode}", lambda: w.run(layout, training, mode)
                )
    finish(w, a.out, results)


def watched(w, name: str, run) -> dict:
    """`run()`'s result with its `nanscope...` stdout lines; then every rank meets (bounded) and says how long."""
    import torch.distributed as dist

    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        result = run()
    result["stdout"] = [line for line in tee.kept.getvalue().splitlines() if line.startswith("nanscope")]
    w.wd.arm(f"{name}: barrier", 120.0)
    dist.barrier()
    print(f"rank {w.rank}: {name}: {[round(s['seconds'], 1) for s in result['steps']]} s", flush=True)
    return result


def finish(w, out: Path, results: dict) -> None:
    """Write this rank's results, meet the others, and leave."""
    import torch.distributed as dist

    w.wd.arm("end", 60.0)
    (out / f"rank{w.rank}.json").write_text(json.dumps(results, indent=1, default=str))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # gloo's teardown at interpreter exit can abort ("terminate called"): the results are written


if __name__ == "__main__":
    main()
