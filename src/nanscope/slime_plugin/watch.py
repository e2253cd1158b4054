"""The hook's machinery on one set of model chunks and their optimizer: sentinel, wrappers, per-step state.

Installed by `before_train_step` (nanscope.slime_plugin.hook), once per set of chunks:

    sentinel          nanscope.trace.sentinel.Sentinel on the chunks: on-device finiteness flags, read once a step
    forward hooks     the micro-batches' input_ids as the first chunk receives them, and whether the gradient
                      entering each chunk's output was finite (the class needs it)
    finish_grad_sync  wrapped on every chunk: the sentinel is read there, before Megatron's own DDP check
    optimizer.step    wrapped (skip mode: a skipped step does not update)
    scheduler.step    wrapped (skip mode: a skipped step does not advance the learning rate)

`remove()` takes every hook off and puts back what was wrapped (unless someone wrapped it again since).
"""

from __future__ import annotations

import os
import time

from nanscope.facts.keys import PER_TOKEN
from nanscope.slime_plugin.collectives import all_reduce_max
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.outputs import Reports, check_dir, replay_instruction, warn
from nanscope.slime_plugin.settings import Settings
from nanscope.slime_plugin.skip import SkipVote
from nanscope.trace.classify import Observation, classify
from nanscope.trace.observe import layer_offset, nonfinite_counts
from nanscope.trace.text import first_lines

_MISSING = object()


class StepWatch:
    """The hook installed on some model chunks and their optimizer (see the module docstring)."""

    def __init__(self, chunks, optimizer, scheduler, settings: Settings):
        from nanscope.trace.sentinel import Sentinel  # heavy: torch, imported by the run already

        self.chunks, self.optimizer, self.scheduler, self.settings = chunks, optimizer, scheduler, settings
        self.coords = Coords.here()
        _agree_on_report_dir(settings.report_dir)
        if self.coords.rank == 0 and any(_overlaps_grad_reduce(chunk) for chunk in chunks):
            warn(
                "--overlap-grad-reduce is on: Megatron checks each gradient bucket during the backward pass, "
                "before nanscope's check at finish_grad_sync: a non-finite step ends with Megatron's error "
                "before nanscope can skip it or write its report"
            )
        self.sentinel = Sentinel(chunks)
        self.files = Reports(settings.report_dir, self.coords)
        self.skip = SkipVote(chunks, settings.max_skips)
        self.logged: list[dict] = []
        self.inputs: list = []  # this step's micro-batches as the first chunk received them (input_ids)
        self.batches: list[dict] = []  # this step's micro-batches as the plugin's loss received them
        self.out_grads: list = []  # this step's: the gradient arriving at a chunk's output is finite (0-dim)
        self.trace = None  # a StepTrace while NANSCOPE_TRACE_STEP's step runs
        self.args, self.where = None, {}
        self.checked = False
        self._handles = [chunks[0].register_forward_pre_hook(self._record_inputs, with_kwargs=True)]
        self._handles += [chunk.register_forward_hook(self._watch_output) for chunk in chunks]
        self._wrapped: list[tuple] = []  # (object, attribute, its previous instance value, our wrapper)
        for chunk in chunks:  # finalize_model_grads -> chunk.finish_grad_sync(): read the sentinel first
            self._wrap(chunk, "finish_grad_sync", self._before)
        self._wrap(optimizer, "step", self.skip.optimizer_step)
        if scheduler is not None:
            self._wrap(scheduler, "step", self.skip.scheduler_step)

    def installed_on(self, chunks, optimizer, scheduler) -> bool:
        return self.chunks == chunks and self.optimizer is optimizer and self.scheduler is scheduler

    def _wrap(self, obj, name: str, make) -> None:
        previous = vars(obj).get(name, _MISSING)
        wrapper = make(getattr(obj, name))
        setattr(obj, name, wrapper)
        self._wrapped.append((obj, name, previous, wrapper))

    def remove(self) -> None:
        """Remove every hook and put back what was wrapped (unless someone wrapped it again since)."""
        self._stop_trace()
        self.sentinel.remove()
        for h in self._handles:
            h.remove()
        for obj, name, previous, wrapper in reversed(self._wrapped):
            if vars(obj).get(name) is wrapper:
                delattr(obj, name) if previous is _MISSING else setattr(obj, name, previous)
        self._wrapped.clear()

    def _stop_trace(self):
        trace, self.trace = self.trace, None
        return None if trace is None else trace.stop()

    # -- per step ----------------------------------------------------------------------------
    def begin(self, args, rollout_id, step_id) -> None:
        """Start of a step: fresh flags and micro-batches; the tracer when NANSCOPE_TRACE_STEP names this step."""
        self._stop_trace()  # a traced step that ended before its backward (an exception)
        self.sentinel.reset()
        self.args, self.where = args, {"rollout_id": rollout_id, "step_id": step_id}
        self.checked = False
        self.skip.begin()
        self.inputs.clear()
        self.batches.clear()
        self.out_grads.clear()
        if self.settings.trace_step == (rollout_id, step_id):
            self.trace = self._start_trace(args, rollout_id)

    def _start_trace(self, args, rollout_id):
        from nanscope.dumps.io import load_rollout  # heavy: numpy; only a traced step reads a dump
        from nanscope.trace.step import StepTrace  # heavy: torch

        path = getattr(args, "load_debug_rollout_data", None)
        rollout = load_rollout(path.format(rollout_id=rollout_id)) if path else None
        trace = StepTrace(self.chunks, rollout, self.coords.cp_rank, self.coords.cp_size)
        trace.start()
        return trace

    def saw_batch(self, batch: dict) -> None:
        """The plugin's loss received `batch` (a recomputation passes the same batch again)."""
        if not any(b is batch for b in self.batches):
            self.batches.append(batch)

    def _record_inputs(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and module.training:
            self.inputs.append(ids)

    def _watch_output(self, module, args, output):
        """The class needs to know whether the gradient entering the chunk (from the loss or the next
        stage) was already non-finite: one reduction per micro-batch, no host sync."""
        import torch  # heavy: torch, imported by the run already

        out = output[0] if isinstance(output, (tuple, list)) else output
        if module.training and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: self.out_grads.append(torch.isfinite(g).all()))

    def _before(self, finish_grad_sync):
        def wrapped(*args, **kwargs):
            if not self.checked:
                self.checked = True
                self.check()
            return finish_grad_sync(*args, **kwargs)

        return wrapped

    def check(self) -> None:
        """At the end of the backward pass, before Megatron's own check: one host sync (plus, in skip
        mode, one all-reduce; on the traced step, one all-gather)."""
        reading = self.sentinel.read(grads=True)
        if not reading.finite:
            self.write_report(reading)
        if self.trace is not None:
            self.write_trace()
        if self.settings.on_nonfinite == "skip":
            self.skip.vote(not reading.finite)
            self.log({"nanscope/skipped_steps": self.skip.skipped})
            if self.skip.over_limit():
                raise RuntimeError(
                    f"nanscope: {self.skip.in_a_row} step(s) in a row had non-finite gradients (the last: rollout "
                    f"{self.where['rollout_id']} step {self.where['step_id']}); NANSCOPE_MAX_SKIPS="
                    f"{self.skip.max_skips}: stopping the run. Reports: {os.path.abspath(self.settings.report_dir)}"
                )

    def log(self, metrics: dict) -> None:
        """On the rank slime logs from: print as slime does, and to wandb when slime uses it."""
        if not self.coords.logs:
            return
        self.logged.append({**self.where, **metrics})
        print(f"nanscope: rollout {self.where['rollout_id']} step {self.where['step_id']}: {metrics}", flush=True)
        if getattr(self.args, "use_wandb", False):
            try:
                _wandb_log(self.args, self.where, metrics)
            except Exception as e:  # wandb down, offline, misconfigured: never the end of the run
                warn(f"could not log {sorted(metrics)} to wandb: {type(e).__name__}: {e}")

    # -- files -------------------------------------------------------------------------------
    def write_report(self, reading) -> str:
        """Where the step went non-finite, how to replay it, and the micro-batch it names."""
        hit = reading.forward or reading.backward
        microbatch = None
        if hit is not None and hit.microbatch < len(self.inputs):
            microbatch = {
                "microbatch": hit.microbatch,
                "input_ids": self.inputs[hit.microbatch].detach().cpu(),
                "batch": _cpu(self.batches[hit.microbatch]) if hit.microbatch < len(self.batches) else None,
            }
        replay = replay_instruction(self.args, **self.where)
        cls = self.classify(reading)
        doc = {
            "rank": self.coords.rank,
            **self.where,
            "mode": self.settings.on_nonfinite,
            "time": time.time(),
            "first_forward": reading.forward.to_dict() if reading.forward else None,
            "first_backward": reading.backward.to_dict() if reading.backward else None,
            "nonfinite_grads": reading.grads[:20],
            "replay": replay,
            "class": cls.cls,
            "class_candidates": list(cls.candidates),
            "class_evidence": cls.evidence,
        }
        path = self.files.report(doc, self.where, microbatch)
        print(
            f"nanscope: rank {self.coords.rank}: non-finite values at rollout {self.where['rollout_id']} step "
            f"{self.where['step_id']}: {path or 'no report written'}; to name the op: {replay['text']}",
            flush=True,
        )
        return path

    def classify(self, reading):
        """The reading's class of cause (trace.classify); the loss inputs are those the plugin's loss saw."""
        inputs = nonfinite_counts(self.batches, PER_TOKEN) if self.coords.last_stage and self.batches else None
        entering = all(bool(g) for g in self.out_grads) if self.out_grads else None
        obs = Observation(
            forward=reading.forward,
            backward=reading.backward,
            grads=tuple(reading.grads),
            loss_inputs=inputs,
            output_grad_finite=entering,
            last_stage=self.coords.last_stage,
            layer_offset=layer_offset(self.chunks),
        )
        return classify(obs)

    def write_trace(self) -> str:
        """`<stem>.trace.json`: this rank's trace and the first producer over all ranks (an all-gather)."""
        import torch.distributed as dist  # heavy: torch, imported by the run already

        from nanscope.trace.step import first_across_ranks  # heavy: torch, only a traced step needs it

        microbatches = self.trace.microbatches
        own = self._stop_trace().to_dict()
        mine = {"rank": self.coords.rank, "pp": self.coords.pp, "tp": self.coords.tp, "trace": own}
        records = [mine]
        if dist.is_initialized():
            records = [None] * dist.get_world_size()
            dist.all_gather_object(records, mine)
        first = first_across_ranks(records)
        doc = {
            **mine,
            **self.where,
            "microbatch_samples": microbatches,
            "rollout_data": getattr(self.args, "load_debug_rollout_data", None),
            "first": first,
        }
        path = self.files.trace(doc, self.where)
        if self.coords.rank == 0:
            head = f"nanscope trace of rollout {self.where['rollout_id']} step {self.where['step_id']} (all ranks):"
            print("\n".join([head] + ["  " + line for line in first_lines(first)]), flush=True)
        return path


def _wandb_log(args, where: dict, metrics: dict) -> None:
    import wandb  # optional: slime's own logger

    wandb.define_metric("nanscope/*", step_metric="train/step")
    steps = args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    wandb.log({**metrics, "train/step": where["rollout_id"] * steps + where["step_id"]})


def _agree_on_report_dir(report_dir: str) -> None:
    """Refuse a report directory that cannot take reports, on every rank at once (one collective at install).

    A node-local directory may fail on some ranks only; a rank that raised alone would leave the others waiting.
    """
    problem = check_dir(report_dir)
    (anywhere,) = all_reduce_max([1.0 if problem else 0.0])
    if anywhere:
        raise ValueError(problem or f"NANSCOPE_REPORT_DIR={report_dir!r}: another rank cannot write reports there")


def _overlaps_grad_reduce(chunk) -> bool:
    """megatron's DDP reduces (and checks) buckets during the backward pass (--overlap-grad-reduce)."""
    return bool(getattr(getattr(chunk, "ddp_config", None), "overlap_grad_reduce", False))


def _cpu(batch: dict) -> dict:
    """slime's micro-batch dict with its tensors detached on the CPU (packed_seq_params left out)."""
    import torch  # heavy: torch, imported by the run already

    return {
        k: [torch.as_tensor(x).detach().cpu() for x in v] if isinstance(v, list) else v
        for k, v in batch.items()
        if k != "packed_seq_params"
    }
