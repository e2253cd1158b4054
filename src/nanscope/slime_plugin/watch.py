"""The hook's machinery on one set of model chunks and their optimizer: sentinel, wrappers, per-step state.

Installed by `before_train_step` (nanscope.slime_plugin.hook), once per set of chunks:

    sentinel          nanscope.trace.sentinel.Sentinel on the chunks: on-device finiteness flags, read once a step
    forward hooks     the micro-batches' input_ids as the first chunk receives them, and whether the gradient
                      entering each chunk's output was finite (the class needs it)
    loss watch        the release's policy loss and log-prob helper, observed (`loss_watch`): the step's
                      micro-batches and current log-probs, for the headroom and the repro bundle
    finish_grad_sync  wrapped on every chunk: the sentinel is read there and the step's vote taken
                      (`step_vote`: one all-gather), before Megatron's own DDP check
    schedule          the model module's get_forward_backward_func, so a non-finite step can run again
                      (`rerun`, NANSCOPE_RERUN=on)
    optimizer.step    wrapped (skip mode: a skipped step does not update)
    scheduler.step    wrapped (skip mode: a skipped step does not advance the learning rate)

`remove()` takes every hook off and puts back what was wrapped (unless someone wrapped it again since).
"""

from __future__ import annotations

import os
import time

from nanscope.facts.keys import PER_TOKEN
from nanscope.loss.target import Target
from nanscope.slime_plugin import bundles, headroom, rerun, rows, step_vote
from nanscope.slime_plugin.collectives import all_reduce_max
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.logs import Logger
from nanscope.slime_plugin.loss_watch import LossWatch
from nanscope.slime_plugin.outputs import Reports, check_dir, replay_instruction, warn
from nanscope.slime_plugin.settings import Settings
from nanscope.slime_plugin.skip import SkipVote
from nanscope.trace.classify import Observation, classify
from nanscope.trace.observe import layer_offset, nonfinite_counts, public_hit, public_name
from nanscope.trace.text import first_lines

_MISSING = object()


class StepWatch:
    """The hook installed on some model chunks and their optimizer (see the module docstring)."""

    def __init__(self, chunks, optimizer, scheduler, settings: Settings, target: Target):
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
        self.logger = Logger(settings, target.release.metrics_logger, self.coords.logs)
        self.inputs: list = []  # this step's micro-batches as the first chunk received them (input_ids)
        # this step's micro-batches as the policy loss received them, numbered by the forwards of the first chunk
        self.losses = LossWatch(target, microbatch=lambda: len(self.inputs) - 1)
        self.out_grads: list = []  # this step's: the gradient arriving at a chunk's output is finite (0-dim)
        self.trace = None  # a StepTrace while NANSCOPE_TRACE_STEP's step runs
        self.args, self.where = None, {}
        self.checked = False
        self.first: rerun.FirstPass | None = None  # a non-finite step's first pass, until its rerun is read
        self.rerun_pending, self.rerun_started = False, 0.0
        self.step_start = None  # the data iterator at this step's schedule call (rows.StepStart), if seen
        self.schedule = rerun.ScheduleWatch(target.release.schedule_module, chunks, self)
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
        self.schedule.remove()
        self.losses.remove()
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
        self.checked, self.first, self.rerun_pending, self.step_start = False, None, False, None
        self.skip.begin()
        self.inputs.clear()
        self.losses.begin()
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
                if self.check():  # every rank defers Megatron's check together: the step is run again
                    return None
            return finish_grad_sync(*args, **kwargs)

        return wrapped

    def check(self) -> bool:
        """At the end of the backward pass, before Megatron's own check: the sentinel's reading (one host sync)
        and the step's vote (one all-gather over the world: `step_vote`); on the traced step, one all-gather more.

        Returns:
            True when Megatron's check must not run now: the step goes non-finite and will be run again.
        """
        reading = self.sentinel.read(grads=True)
        vote = step_vote.exchange(not reading.finite, self.coords, self._headroom())
        if self.first is not None:  # this is the rerun's check
            self._after_rerun(reading, vote)
            return False
        if self.trace is not None:  # the traced step's trace is its first pass's
            self.write_trace()
        if vote.bad and self.settings.rerun == "on" and self.schedule.active:
            cls = self.classify(reading)
            error = rerun.megatron_error(self.chunks) if not reading.finite else None
            self.first = rerun.FirstPass(reading, cls, list(self.losses.seen), vote, error)
            self.rerun_pending = True
            return True
        if not reading.finite:
            self.write_report(reading)
        self._end_step(vote, skip=vote.bad)
        return False

    def begin_rerun(self, started: float) -> None:
        """Between the passes (the schedule watch calls it): the second pass is observed afresh."""
        self.rerun_pending, self.rerun_started = False, started
        self.checked = False
        self.sentinel.reset()
        self.losses.begin()
        self.inputs.clear()
        self.out_grads.clear()
        self.optimizer.zero_grad()

    def _after_rerun(self, reading, vote) -> None:
        """The rerun's reading against the first pass's: the verdict, the report, then raise or skip."""
        first, self.first = self.first, None
        verdict = rerun.agree(
            first, rerun.summary(self.classify(reading)), vote.bad_ranks, self.coords, self.rerun_started
        )
        saw = self.coords.rank in first.vote.bad_ranks
        path = (
            self.write_report(first.reading, seen=first.seen, cls=first.classification, verdict=verdict)
            if saw
            else None
        )
        if saw or self.coords.logs:
            print(verdict.line(), flush=True)
        stop = self.settings.on_nonfinite == "raise" or (
            self.settings.skip_on == "transient" and verdict.verdict == rerun.REPRODUCIBLE
        )
        if not stop:
            self._end_step(vote, skip=True)
            return
        if saw:
            where = f" (report {path}, its bundle beside it)" if path else ""
            raise RuntimeError(f"{verdict.line()}{where}\n{first.megatron_error or 'nanscope: non-finite step'}")
        raise rerun.PeerNonFinite(
            f"nanscope: rank {self.coords.rank}: stopping with ranks {list(first.vote.bad_ranks)}, whose step was "
            f"non-finite ({verdict.verdict})"
        )

    def _end_step(self, vote, *, skip: bool) -> None:
        """The step's end: skip mode's skip, its count and limit, and the step's metrics logged."""
        metrics = dict(vote.metrics)
        if self.settings.on_nonfinite == "skip":
            self.skip.apply(skip)
            metrics["nanscope/skipped_steps"] = self.skip.skipped
            if self.coords.logs:
                shown = {"nanscope/skipped_steps": self.skip.skipped}
                print(f"nanscope: rollout {self.where['rollout_id']} step {self.where['step_id']}: {shown}", flush=True)
        self.logger.step(self.args, self.where, metrics, vote.where)
        if self.settings.on_nonfinite == "skip" and self.skip.over_limit():
            raise RuntimeError(
                f"nanscope: {self.skip.in_a_row} step(s) in a row had non-finite gradients (the last: rollout "
                f"{self.where['rollout_id']} step {self.where['step_id']}); NANSCOPE_MAX_SKIPS="
                f"{self.skip.max_skips}: stopping the run. Reports: {os.path.abspath(self.settings.report_dir)}"
            )

    def _rows(self, microbatch: int | None) -> tuple[list | None, str]:
        """The rollout-dump rows of this step's micro-batch `microbatch` (`rows`)."""
        recipe = self.losses.target.release.rows_recipe
        return rows.rows(recipe, self.step_start, microbatch, self.coords, self.args)

    def _headroom(self):
        """This rank's headroom row; a failure to measure is a warning and an empty row (the vote must happen)."""
        try:
            return headroom.measure(self.losses.seen, self.losses.target, self._device())
        except Exception as e:  # nanscope's own failure: never the end of the run, never a rank out of the vote
            warn(f"rank {self.coords.rank}: could not measure the step's headroom: {type(e).__name__}: {e}")
            return headroom.empty(self._device())

    def _device(self):
        """Where the step's numbers live: the model's parameters' device."""
        return next(self.chunks[0].parameters()).device

    # -- files -------------------------------------------------------------------------------
    def write_report(self, reading, *, seen: list | None = None, cls=None, verdict=None) -> str | None:
        """Where the step went non-finite (public module names), how to replay it, and its repro bundle.

        Args:
            seen: the step's micro-batches as the loss saw them (default: this pass's; a rerun's report has the
                first pass's).
            cls: the reading's classification (default: this pass's).
            verdict: the rerun's (rerun.Verdict), when the step was run again.
        """
        seen = self.losses.seen if seen is None else seen
        cls = self.classify(reading) if cls is None else cls
        offset = layer_offset(self.chunks)
        first_forward, first_backward = public_hit(reading.forward, offset), public_hit(reading.backward, offset)
        replay = replay_instruction(self.args, **self.where)
        doc = {
            "rank": self.coords.rank,
            **self.where,
            "mode": self.settings.on_nonfinite,
            "time": time.time(),
            "first_forward": first_forward.to_dict() if first_forward else None,
            "first_backward": first_backward.to_dict() if first_backward else None,
            "nonfinite_grads": [public_name(g, offset) for g in reading.grads[:20]],
            "expert_tokens": reading.expert_tokens(offset),  # the failing micro-batch: tokens per expert
            "replay": replay,
            "class": cls.cls,
            "class_candidates": list(cls.candidates),
            "class_evidence": cls.evidence,
        }
        if verdict is not None:
            doc["rerun"] = verdict.to_dict()
        try:
            why = bundles.reasons(reading, seen, self.coords.last_stage)
            contents = bundles.document(
                target=self.losses.target, coords=self.coords, args=self.args, where=self.where, report=doc,
                seen=seen, why=why, rows=self._rows,
            )  # fmt: skip
        except Exception as e:  # nanscope's own failure: the report still goes out, the run goes on
            warn(f"rank {self.coords.rank}: could not build the repro bundle: {type(e).__name__}: {e}")
            contents = None
        path = self.files.report(doc, self.where, contents)
        offline = f"nanscope trace {self.files.dir}"
        print(
            f"nanscope: rank {self.coords.rank}: non-finite values at rollout {self.where['rollout_id']} step "
            f"{self.where['step_id']}: {path or 'no report written'}; to name the op offline: {offline}; "
            f"on the cluster: {replay['text']}",
            flush=True,
        )
        return path

    def classify(self, reading):
        """This pass's reading's class of cause (trace.classify), in public names; the loss inputs are those the
        policy loss received."""
        batches = [seen.batch for seen in self.losses.seen]
        inputs = nonfinite_counts(batches, PER_TOKEN) if self.coords.last_stage and batches else None
        entering = all(bool(g) for g in self.out_grads) if self.out_grads else None
        offset = layer_offset(self.chunks)
        obs = Observation(
            forward=public_hit(reading.forward, offset),
            backward=public_hit(reading.backward, offset),
            grads=tuple(public_name(g, offset) for g in reading.grads),
            loss_inputs=inputs,
            output_grad_finite=entering,
            last_stage=self.coords.last_stage,
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
