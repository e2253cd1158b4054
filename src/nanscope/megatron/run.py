"""The harness's runs on one rank: each run from its seed to its RankRecord.

    runner = Runner(spec, out, watchdog)      # parallel state is up (bootstrap.init)
    record = runner.execute(i, spec.runs[i])  # never raises: an exception is recorded

Each run rebuilds the model and optimizer from its seed (runs are independent), builds every step's batch
against the current model (slime's log-prob pass), and trains like slime's train_one_step (`step.py`). An
exception (megatron's NaN check raises RuntimeError) is caught per run and rank and recorded (message,
megatron frames, time); the worker (`worker.py`) writes the record and moves on after a barrier.

Which ranks raise (measured): at TP2 x PP2 (DP 1) every rank fails the NaN check in finish_grad_sync,
the last stage first (1F1B: it finishes its backward first) — NaN flows back through every stage and
TP rank. With DP > 1 only the replicas whose samples carry the NaN raise; the others pass their local
check and block in the data-parallel all-reduce until the watchdog ends them.
"""

from __future__ import annotations

import hashlib
import os
import time
import traceback
from pathlib import Path

from nanscope import loss
from nanscope.causes import catalogue
from nanscope.facts.megatron import core_frame
from nanscope.megatron import bootstrap, progress
from nanscope.megatron.context import RunContext
from nanscope.megatron.spec import RankRecord, RunSpec, WorkerSpec
from nanscope.megatron.watchdog import Watchdog
from nanscope.trace.sentinels.observe import layer_offset, public_name


class Runner:
    """One rank's runs: parallel state is up (bootstrap.init); executes runs one at a time."""

    def __init__(self, spec: WorkerSpec, out: Path, watchdog: Watchdog):
        import torch.distributed as dist  # heavy: torch.distributed, in the ranks only

        self.spec, self.out, self.wd = spec, out, watchdog
        self.rank = dist.get_rank()
        self.raised: Exception | None = None  # the last run's exception, with its traceback (the Ray actor raises it)
        self.logits: dict = {}  # the shared first-step log-prob passes (`policy`)

    def execute(self, index: int, run: RunSpec) -> RankRecord:
        """One run on this rank; any exception is recorded in the returned record, never raised."""
        from megatron.core import parallel_state as mpu  # heavy: megatron-core and torch, in the ranks only

        from nanscope.megatron import step
        from nanscope.megatron.model import TinyQwen3MoE

        t0 = time.time()
        self.raised = None
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
            self.raised = e
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
        from nanscope.loss import as_is  # heavy: torch, in the ranks only (as the rest of this block)
        from nanscope.megatron import cpu_distributed, step
        from nanscope.megatron.model import layers_held
        from nanscope.megatron.observe import observe
        from nanscope.trace.sentinels.sentinel import Sentinel

        spec, rec, limit = ctx.spec, ctx.record, self.spec.rank_timeout_s
        self.wd.arm(f"{ctx.name}: build", limit)
        ctx.model, ctx.transformer_config, ctx.optimizer = bootstrap.build_training(
            seed=spec.seed, bf16=self.spec.bf16, lr=spec.lr
        )
        rec.layers = layers_held(ctx.transformer_config)
        planted = spec.planted()
        if planted is not None:  # before the sentinel's hooks: they run after the fault's and see it
            self.plant(ctx, *planted)
        ctx.sentinel = Sentinel([ctx.model], output_grads=True)  # names a backward's producer, not only its params
        cpu_distributed.agree_on_grad_check(ctx)
        if spec.save_grads:
            ctx.grads_path = ctx.path("grads")
            rec.grads_path = str(ctx.grads_path)
        if spec.hook:
            from nanscope import slime_plugin  # heavy: torch

            slime_plugin.configure(ctx.hook_settings())
            ctx.hook = slime_plugin
        loss_module = as_is if spec.plugin else loss.get(spec.loss)  # plugin: slime's loss_function dispatches
        loop = None
        if spec.natural:  # each step's batch sampled from the current policy; the loop keeps what the loss saw
            from nanscope.megatron.natural import NaturalLoop  # heavy: torch, in the ranks only

            loop = loss_module = NaturalLoop(ctx, loss_module)
        for i in range(1, spec.steps + 1):
            ctx.step = i
            ctx.loss_overrides = {} if spec.defused else catalogue.get(spec.hazard_at(i)).loss_overrides
            self.wd.arm(f"{ctx.name} step {i}: {'rollout' if loop else 'log-prob pass'}", limit)
            batch, seq_length = self.hazard_batch(ctx, i) if loop is None else loop.batch(ctx, i)
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
                if loop is not None and (entry := loop.entry(batch, i)) is not None:
                    rec.series.append(entry)
            rec.optimizer_grad_norm.append(None if grad_norm is None else float(grad_norm))
            rec.losses.append(losses)
            if self.rank == 0:  # the launcher's progress line for this step
                progress.note(self.out, run=ctx.index, step=i, steps=spec.steps)

    def hazard_batch(self, ctx: RunContext, i: int) -> tuple[dict, int]:
        """Step i's case-shaped batch with the run's hazard (`hazards.build`), and the micro-batch length."""
        from nanscope import hazards  # heavy: torch, in the ranks only
        from nanscope.megatron import step

        spec = ctx.spec
        seed = spec.seed * 1000 + i
        rollout = hazards.case_rollout(ctx.vocab_size, seed, **hazards.shape(ctx.loss_flags))
        seq_length = step.seq_length_for(rollout.total_lengths, ctx.layout.tp)
        policy = self.policy(ctx, seq_length, i)
        batch = hazards.build(
            spec.hazard_at(i), policy, rollout, seed=seed, defused=spec.defused, progress=spec.progress_at(i)
        )
        return batch, seq_length

    @staticmethod
    def plant(ctx: RunContext, spec_text: str, at: int | None, once: bool) -> None:
        """Plant a model fault (megatron.faults) in this rank's stage, firing at step `at` (None: always), on the
        first call only if `once`."""
        from nanscope.megatron import faults  # heavy: torch, in the ranks only

        fault = faults.parse(spec_text, at, once)
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
        from nanscope.megatron import step  # heavy: torch, in the ranks only

        run = step.policy(ctx, seq_length)
        if i != 1 or ctx.spec.hook:
            return run

        def shared(tokens: list) -> list:
            key = (ctx.spec.seed, ctx.spec.planted(), seq_length, tuple(t.numpy().tobytes() for t in tokens))
            if key not in self.logits:
                self.logits[key] = run(tokens)
            return [logits.clone() for logits in self.logits[key]]

        return shared

    def train(self, ctx: RunContext, batch: dict, seq_length: int, loss_module, i: int):
        """step.train_one_step, under the tracer when the run asks for it (its report into the record)."""
        from nanscope.megatron import step  # heavy: torch, in the ranks only (as the tracer)
        from nanscope.trace.tracer.locator import Tracer

        if not ctx.spec.trace:
            return step.train_one_step(ctx, batch, seq_length, loss_module, i)
        with Tracer(modules=[ctx.model]) as ctx.tracer:
            try:
                return step.train_one_step(ctx, batch, seq_length, loss_module, i)
            finally:
                ctx.record.trace = _public_trace(ctx.tracer.report().to_dict(), ctx)
                ctx.tracer = None

    def finish_record(self, ctx: RunContext) -> None:
        """Parameters after the run: finiteness, checksum, optionally the tensors themselves."""
        import torch  # heavy: torch, in the ranks only

        ctx.model.zero_grad_buffer()
        params = {name: param.detach().float().clone() for name, param in ctx.model.named_parameters()}
        ctx.record.params_finite = all(bool(torch.isfinite(param).all()) for param in params.values())
        ctx.record.param_checksum = checksum(params)
        if ctx.spec.save_params:
            torch.save(params, ctx.path("params"))
            ctx.record.params_path = str(ctx.path("params"))


def checksum(params: dict) -> str:
    """sha256 over {name: tensor} in name order (names and bytes)."""
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(name.encode())
        digest.update(params[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def _public_trace(trace: dict, ctx: RunContext) -> dict:
    """A trace report's module paths as `--fault` and the sentinel name them (wrappers off, layers global)."""
    for key in ("forward", "backward", "first_forward", "first_backward"):
        event = trace[key]
        if event is not None and event["module"] is not None:
            event["module"] = public_name(event["module"], layer_offset([ctx.model]))
    return trace


def _megatron_frames(tb) -> list[tuple[str, int, str]]:
    found = (core_frame(frame.filename, frame.lineno, frame.name) for frame in traceback.extract_tb(tb))
    return [frame for frame in found if frame is not None]


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
