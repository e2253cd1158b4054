"""The harness's launch: `python -m nanscope.megatron.worker --nproc-per-node N --master-port P --spec SPEC --out DIR`.

This process imports megatron-core and everything a rank runs ONCE (`_import_rank_path`), then runs
torchrun's elastic agent in itself (torch.distributed.run's own configuration of these flags, static
rendezvous, no restarts) with start method "fork": each rank is forked from it with the imports done
(about 3 s of CPU per rank on 2 cores otherwise, and the optimizer's torch._dynamo import), and runs
`rank_main`. A rank starts megatron on CPU once (`bootstrap.init`), then executes the spec's runs in order.
Each run rebuilds the model and optimizer from its seed (runs are independent), builds every step's batch
against the current model (slime's log-prob pass), and trains like slime's train_one_step (`step.py`). An
exception (megatron's NaN check raises RuntimeError) is caught per run and rank, recorded (message,
megatron frames, time) and the rank moves on after a barrier. Each rank writes `DIR/run{i}.rank{r}.json`.
A watchdog thread ends a rank stuck in one phase (a collective whose peers raised) with os._exit(3),
leaving `DIR/stuck.rank{r}.txt` (`watchdog.py`); the agent then stops the other ranks and exits 1.

Which ranks raise (measured): at TP2 x PP2 (DP 1) every rank fails the NaN check in finish_grad_sync,
the last stage first (1F1B: it finishes its backward first) — NaN flows back through every stage and
TP rank. With DP > 1 only the replicas whose samples carry the NaN raise; the others pass their local
check and block in the data-parallel all-reduce until the watchdog ends them.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from nanscope.facts.megatron import core_frame
from nanscope.megatron.context import RunContext
from nanscope.megatron.spec import RankRecord, RunSpec, WorkerSpec
from nanscope.megatron.watchdog import Watchdog, barrier
from nanscope.trace.observe import layer_offset, public_name


class Worker:
    """One rank: parallel state is up (bootstrap.init); executes runs."""

    def __init__(self, spec: WorkerSpec, out: Path, watchdog: Watchdog):
        import torch.distributed as dist

        self.spec, self.out, self.wd = spec, out, watchdog
        self.rank = dist.get_rank()
        self.logits: dict = {}  # the shared first-step log-prob passes (`policy`)

    def execute(self, index: int, run: RunSpec) -> RankRecord:
        """One run on this rank; any exception is recorded in the returned record, never raised."""
        from megatron.core import parallel_state as mpu

        from nanscope.megatron import step
        from nanscope.megatron.model import TinyQwen3MoE

        t0 = time.time()
        _apply_fault(run.fault, self.rank)
        rec = RankRecord(
            rank=self.rank,
            pp=mpu.get_pipeline_model_parallel_rank(),
            tp=mpu.get_tensor_model_parallel_rank(),
            dp=mpu.get_data_parallel_rank(),
            ep=mpu.get_expert_model_parallel_rank(),
            layers=[],
            holds_output_layer=mpu.is_pipeline_last_stage(),
            ok=True,
        )
        ctx = RunContext(
            index=index,
            spec=run,
            layout=self.spec.layout,
            out=self.out,
            record=rec,
            vocab_size=TinyQwen3MoE().vocab_size,
            loss_flags=self.spec.loss_flags,
        )
        try:
            self.steps(ctx)
        except Exception as e:  # megatron's NaN check raises RuntimeError; record anything
            rec.ok, rec.error, rec.error_type = False, str(e), type(e).__name__
            rec.error_time, rec.error_step = ctx.error_time or time.time(), len(rec.hazard_sites)
            rec.frames = _megatron_frames(e.__traceback__)
            if ctx.model is not None:
                rec.grad_norms = step.bucket_grad_norms(ctx.model)
        if ctx.model is not None:
            self.finish_record(ctx)
        if ctx.hook is not None:  # the next run builds new chunks
            ctx.hook.uninstall()
        rec.seconds = time.time() - t0
        return rec

    def steps(self, ctx: RunContext) -> None:
        """Build the model, then per step: the batch against the current model, then train_one_step."""
        from nanscope import hazards, loss
        from nanscope.causes import catalogue
        from nanscope.loss import as_is
        from nanscope.megatron import bootstrap, step
        from nanscope.megatron.model import layers_held
        from nanscope.megatron.observe import observe
        from nanscope.trace import Sentinel

        spec, rec, limit = ctx.spec, ctx.record, self.spec.rank_timeout_s
        self.wd.arm(f"{ctx.name}: build", limit)
        ctx.model, ctx.config, ctx.optimizer = bootstrap.build_training(seed=spec.seed, bf16=self.spec.bf16)
        rec.layers = layers_held(ctx.config)
        planted = spec.planted()
        if planted is not None:  # before the sentinel's hooks: they run after the fault's and see it
            self.plant(ctx, *planted)
        ctx.sentinel = Sentinel([ctx.model], output_grads=True)  # names a backward's producer, not only its params
        step.agree_on_grad_check(ctx)
        if spec.save_grads:
            ctx.grads_path = ctx.path("grads")
            rec.grads_path = str(ctx.grads_path)
        if spec.hook:
            from nanscope import slime_plugin

            slime_plugin.configure(ctx.hook_settings())
            ctx.hook = slime_plugin
        loss_module = as_is if spec.plugin else loss.get(spec.loss)  # plugin: slime's loss_function dispatches
        for i in range(1, spec.steps + 1):
            ctx.step = i
            ctx.loss_overrides = {} if spec.defused else catalogue.get(spec.hazard_at(i)).loss_overrides
            seed = spec.seed * 1000 + i
            rollout = hazards.case_rollout(ctx.vocab_size, seed, **hazards.shape(ctx.loss_flags))
            seq_length = step.seq_length_for(rollout.total_lengths, ctx.layout.tp)
            self.wd.arm(f"{ctx.name} step {i}: log-prob pass", limit)
            policy = self.policy(ctx, seq_length, i)
            batch = hazards.build(spec.hazard_at(i), policy, rollout, seed=seed, defused=spec.defused)
            site = batch.pop("hazard_site", None)
            rec.hazard_sites.append(site)
            rec.site_log_probs.append(_site_log_probs(batch, site))
            if ctx.rollouts and self.rank == 0:  # slime's buffer saves the rollout once
                step.save_rollout(ctx.rollouts.format(rollout_id=i - 1), batch, i - 1)
            self.wd.arm(f"{ctx.name} step {i}: train_one_step", limit)
            stepped = False
            ctx.sentinel.reset()  # count this step's training micro-batches, not the log-prob pass's
            try:
                losses, grad_norm, rec.grad_norms = self.train(ctx, batch, seq_length, loss_module, i)
                stepped = True
            finally:
                if ctx.hook is not None:
                    rec.skipped_steps, rec.reports = ctx.hook.skipped_steps(), ctx.hook.reports()
                    rec.hook_log = ctx.hook.logged()
                observe(ctx, batch, stepped)
            rec.optimizer_grad_norm.append(None if grad_norm is None else float(grad_norm))
            rec.losses.append(losses)

    @staticmethod
    def plant(ctx: RunContext, spec_text: str, at: int | None) -> None:
        """Plant a model fault (megatron.faults) in this rank's stage, firing at step `at` (None: always)."""
        from nanscope.megatron import faults  # heavy: torch, imported after the agent's fork set-up

        fault = faults.parse(spec_text, at)
        faults.plant(ctx.model, fault, layer_offset([ctx.model]), lambda: at is None or ctx.step == at)

    def policy(self, ctx: RunContext, seq_length: int, i: int):
        """Step i's log-prob pass (step.policy), shared by the runs of this launch on their first step.

        On step 1 the model is freshly built from the run's seed, with the run's planted fault if any (it
        fires in this pass too) and no hook, so its logits for the same tokens and padded length are the
        same, bit for bit, in every run of the launch with that seed and fault: the matrix makes one pass
        per distinct first-step batch and fault instead of one per run. Every rank decides alike (same
        key), so the pass's collectives stay matched; the records are those of unshared passes, byte
        for byte (tests/megatron/test_harness.py).
        """
        from nanscope.megatron import step

        run = step.policy(ctx, seq_length)
        if i != 1 or ctx.spec.hook:
            return run

        def shared(tokens: list) -> list:
            key = (ctx.spec.seed, ctx.spec.planted(), seq_length, tuple(t.numpy().tobytes() for t in tokens))
            if key not in self.logits:
                self.logits[key] = run(tokens)
            return [x.clone() for x in self.logits[key]]

        return shared

    def train(self, ctx: RunContext, batch: dict, seq_length: int, loss_module, i: int):
        """step.train_one_step, under the tracer when the run asks for it (its report into the record)."""
        from nanscope.megatron import step

        if not ctx.spec.trace:
            return step.train_one_step(ctx, batch, seq_length, loss_module, i)
        from nanscope.trace import Tracer

        with Tracer(modules=[ctx.model]) as ctx.tracer:
            try:
                return step.train_one_step(ctx, batch, seq_length, loss_module, i)
            finally:
                ctx.record.trace = _public_trace(ctx.tracer.report().to_dict(), ctx)
                ctx.tracer = None

    def finish_record(self, ctx: RunContext) -> None:
        """Parameters after the run: finiteness, checksum, optionally the tensors themselves."""
        import torch

        ctx.model.zero_grad_buffer()
        params = {n: p.detach().float().clone() for n, p in ctx.model.named_parameters()}
        ctx.record.params_finite = all(bool(torch.isfinite(p).all()) for p in params.values())
        ctx.record.param_checksum = checksum(params)
        if ctx.spec.save_params:
            torch.save(params, ctx.path("params"))
            ctx.record.params_path = str(ctx.path("params"))


def checksum(params: dict) -> str:
    """sha256 over {name: tensor} in name order (names and bytes)."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def _public_trace(trace: dict, ctx: RunContext) -> dict:
    """A trace report's module paths as `--fault` and the sentinel name them (wrappers off, layers global)."""
    for key in ("forward", "backward", "first_forward", "first_backward"):
        event = trace[key]
        if event is not None and event["module"] is not None:
            event["module"] = public_name(event["module"], layer_offset([ctx.model]))
    return trace


def _megatron_frames(tb) -> list[tuple[str, int, str]]:
    found = (core_frame(f.filename, f.lineno, f.name) for f in traceback.extract_tb(tb))
    return [f for f in found if f is not None]


def _site_log_probs(batch: dict, site) -> dict | None:
    """{"policy", "ref", "rollout"} log-probs at a (sample, response position) site, or None."""
    if not site or site[1] is None:
        return None
    i, j = site
    keys = (("policy", "log_probs"), ("ref", "ref_log_probs"), ("rollout", "rollout_log_probs"))
    return {name: float(batch[key][i][j]) for name, key in keys if key in batch}


def _apply_fault(fault: str | None, rank: int) -> None:
    """Test hook: "exit:R" ends rank R at once; "hang:R" blocks rank R until its watchdog fires."""
    if not fault:
        return
    kind, _, who = fault.partition(":")
    assert kind in ("exit", "hang"), f"unknown fault {fault!r}"
    if int(who) == rank:
        if kind == "exit":
            os._exit(1)
        time.sleep(10**6)


def _die_with_parent() -> None:
    """Linux: SIGKILL this rank when the agent dies (prctl PR_SET_PDEATHSIG), so no rank outlives it."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


# What a rank imports on its way through a run, imported by the agent before it forks the ranks. The first
# megatron optimizer imports torch._dynamo (torch.optim wraps add_param_group in torch._disable_dynamo).
RANK_MODULES = (
    "torch._dynamo",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.models.gpt.gpt_layer_specs",
    "nanscope.hazards",
    "nanscope.loss.as_is",
    "nanscope.loss.safe",
    "nanscope.megatron.faults",
    "nanscope.megatron.model",
    "nanscope.megatron.observe",
    "nanscope.megatron.step",
    "nanscope.facts.args",
    "nanscope.slime_plugin",
    "nanscope.trace.classify",
)


def _import_rank_path() -> None:
    """megatron-core (torch.compile deferred, `bootstrap.import_megatron`) and RANK_MODULES."""
    import importlib

    from nanscope.megatron import bootstrap

    bootstrap.import_megatron()
    for name in RANK_MODULES:
        importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    """The launch process: the shared imports, then torchrun's agent forking the ranks; exits with 1 when a
    rank failed (as torchrun does), else 0."""
    t_start = time.time()
    p = argparse.ArgumentParser(prog="python -m nanscope.megatron.worker")
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    spec = WorkerSpec.from_json(Path(a.spec).read_text())
    _import_rank_path()
    imports_s = time.time() - t_start
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    flags = ["--nproc-per-node", str(a.nproc_per_node), "--master-addr", "127.0.0.1",
             "--master-port", str(a.master_port), "--start-method", "fork", "-m", __name__]  # fmt: skip
    config, _, _ = run.config_from_args(run.parse_args(flags))
    gc.freeze()  # the ranks' collections never scan the imported modules they inherit
    sys.stdout.flush()
    sys.stderr.flush()
    code = 0
    try:
        elastic_launch(config, entrypoint=rank_main)(spec, Path(a.out), t_start, imports_s)
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr)
        code = 1
    # Skip the interpreter's teardown of torch and megatron-core (a second or more on 2 cores).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_main(spec: WorkerSpec, out: Path, started: float, imports_s: float) -> int:
    """One rank, forked by the agent with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    The rank runs in a fresh thread (`_rank`), so its Python frames start at the base of a new frame stack
    as in a fresh process: forked ~20 frames deep inside the agent, the model's calls crossed one of
    CPython 3.11's 16 KiB frame-stack chunks at a hot depth, which maps and unmaps the chunk on every
    crossing (measured: 64,000 mmap/munmap pairs per rank in a matrix, ~10 us each; about 500 in a thread).
    The signals the agent handles in Python are reset to an interpreter's defaults first: its handler,
    inherited through fork, raises in Python, which waits for a blocking collective to return.

    Returns 0 to the agent after every record is on disk and every rank is past the exit barrier; the
    forked process then ends with os._exit (multiprocessing's fork start), without interpreter teardown.
    """
    _die_with_parent()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    done = []
    thread = threading.Thread(target=lambda: done.append(_rank(spec, out, started, imports_s)), daemon=True)
    thread.start()
    thread.join()
    if not done:  # its traceback is printed above
        raise RuntimeError(f"rank {os.environ['RANK']} failed")
    return 0


def _rank(spec: WorkerSpec, out: Path, started: float, imports_s: float) -> int:
    """Process-group init, the spec's runs, the exit barrier."""
    import torch
    import torch.distributed as dist

    from nanscope.megatron import bootstrap

    rank = int(os.environ["RANK"])
    wd = Watchdog(out, rank)
    wd.arm("process-group init", spec.startup_timeout_s)
    t_init = time.time()
    layout = spec.layout
    bootstrap.init(tp=layout.tp, pp=layout.pp, ep=layout.ep, etp=layout.etp,
                   timeout_s=spec.startup_timeout_s, group_timeout_s=spec.rank_timeout_s)  # fmt: skip
    assert layout.world == dist.get_world_size(), f"layout world {layout.world} != {dist.get_world_size()}"
    torch.set_num_threads(1)
    startup = {"started": started, "imports_s": imports_s, "init_s": time.time() - t_init}
    (out / f"startup.rank{rank}.json").write_text(json.dumps(startup))
    worker = Worker(spec, out, wd)
    for i in range(spec.first_run, len(spec.runs)):
        barrier(wd, spec.rank_timeout_s, f"run {i}")
        wd.arm(f"run {i}", spec.rank_timeout_s)
        rec = worker.execute(i, spec.runs[i])
        (out / f"run{i}.rank{rank}.json").write_text(rec.to_json())
    barrier(wd, spec.rank_timeout_s, "exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
