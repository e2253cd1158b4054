"""The hook on one set of model chunks and their optimizer, and the step it watches, as a small state machine.

Installed by `before_train_step` (nanscope.slime_plugin.hook), once per set of chunks:

    sentinel          nanscope.trace.sentinels.sentinel.Sentinel on the chunks: on-device finiteness flags, read once
                      a step
    forward hooks     each chunk's training forwards (the loss's micro-batch index is its chunk's count), and
                      whether the gradient entering each chunk's output was finite (the class needs it)
    loss watch        the release's policy loss and log-prob helper, observed (`loss_watch`): the step's
                      micro-batches and current log-probs, for the headroom and the repro bundle
    gate              every chunk's finish_grad_sync (`gate`): the first call of a pass reads the sentinel and
                      takes the step's vote (`step_vote`: one all-gather, the step's one host sync), and holds or
                      lets through every chunk's megatron check and reduce together
    schedule          the model module's get_forward_backward_func, so a non-finite step can run again
                      (`rerun`, NANSCOPE_RERUN=on)
    optimizer.step    wrapped (skip mode: a skipped step does not update)
    scheduler.step    wrapped (skip mode: a skipped step does not advance the learning rate)

The step, each state's work in its own module:

    watching     the vote finds the pass finite: the step's metrics are logged, the gate opens
    non-finite   every rank tells every rank what it saw (`nonfinite`: one all-gather of small records)
    reported     each rank that saw a value writes its report and bundle now (`report`), before anything else
    rerun        the schedule runs the step again (`rerun`); its pass is watched and voted on afresh
    verdict      both passes' sightings decide the verdict (`verdict`), added to the report
    raise|skip   every rank raises with Megatron's words, skips, or goes on (`ending`)

`remove()` takes every hook off and puts back what was wrapped (unless someone wrapped it again since).
"""

from __future__ import annotations

import dataclasses
import os

from nanscope.facts.keys import PER_TOKEN
from nanscope.loss.guard import METRICS as COUNTERS
from nanscope.loss.target import Target
from nanscope.slime_plugin import ending, headroom, nonfinite, rerun, rows, step_vote, verdict
from nanscope.slime_plugin.collectives import all_reduce_max
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.gate import HOLD, OPEN, DeferredCheck, Gate, drain, overlapped, wait
from nanscope.slime_plugin.logs import Logger
from nanscope.slime_plugin.loss_watch import LossWatch
from nanscope.slime_plugin.names import PublicNames
from nanscope.slime_plugin.outputs import Reports, check_dir, say, warn
from nanscope.slime_plugin.report import Reporter
from nanscope.slime_plugin.settings import Settings
from nanscope.slime_plugin.skip import SkipVote
from nanscope.trace.sentinels.classify import Observation, classify
from nanscope.trace.sentinels.observe import nonfinite_counts
from nanscope.trace.tracer.text import first_lines

_MISSING = object()


class _Step:
    """One step's state: where it is, and what its non-finite first pass left for the rerun and the end."""

    def __init__(self, args=None, where: dict | None = None):
        self.args, self.where = args, where or {}
        self.first: list | None = None  # every rank's sighting of a non-finite first pass (nonfinite.Sighting)
        self.report: str | None = None  # this rank's report of it
        self.rerun_pending = False  # the gate held the first pass for a rerun
        self.rerun_started = 0.0


class StepWatch:
    """The hook installed on some model chunks and their optimizer (see the module docstring)."""

    def __init__(self, chunks, optimizer, scheduler, settings: Settings, target: Target):
        from nanscope.trace.sentinels.sentinel import Sentinel  # heavy: torch, imported by the run already

        self.chunks, self.optimizer, self.scheduler, self.settings = chunks, optimizer, scheduler, settings
        self.coords = Coords.here()
        _agree_on_report_dir(settings.report_dir)
        if self.coords.rank == 0:
            for line in settings.unknown_lines():
                warn(line)
        self.sentinel = Sentinel(chunks)
        self.names = PublicNames(chunks)
        self.files = Reports(settings.report_dir, self.coords, settings.max_bundles)
        self.reporter = Reporter(self.files, self.coords, self.names, settings.on_nonfinite)
        self.skip = SkipVote(chunks, settings.max_skips)
        self.logger = Logger(settings, target.release.metrics_logger, self.coords.logs)
        self.forwards = [0] * len(chunks)  # this pass's training forwards of each chunk
        # the loss's micro-batch: the last chunk's forwards (it computes the loss on the last pipeline stage)
        self.losses = LossWatch(target, microbatch=lambda: self.forwards[-1] - 1)
        self.out_grads: list[list] = [[] for _ in chunks]  # per chunk: its output's gradient is finite (0-dim)
        self.trace = None  # a StepTrace while NANSCOPE_TRACE_STEP's step runs
        self.step = _Step()
        self.step_start = None  # the data iterator at this step's schedule call (rows.StepStart), if seen
        self.schedule = rerun.ScheduleWatch(target.release.schedule_module, chunks, self)
        self.deferred = DeferredCheck(chunks)
        self.overlapped = overlapped(chunks)
        self.gate = Gate(chunks, self._decide)
        self._handles = []
        for i, chunk in enumerate(chunks):
            self._handles.append(chunk.register_forward_pre_hook(self._count_forward(i)))
            self._handles.append(chunk.register_forward_hook(self._watch_output(i)))
        self._wrapped: list[tuple] = []  # (object, attribute, its previous instance value, our wrapper)
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
        self.gate.remove()
        self.deferred.remove()
        for h in self._handles:
            h.remove()
        for obj, name, previous, wrapper in reversed(self._wrapped):
            if vars(obj).get(name) is wrapper:
                delattr(obj, name) if previous is _MISSING else setattr(obj, name, previous)
        self._wrapped.clear()

    def _stop_trace(self):
        trace, self.trace = self.trace, None
        return None if trace is None else trace.stop()

    # -- watching ----------------------------------------------------------------------------
    def begin(self, args, rollout_id, step_id) -> None:
        """Start of a step: fresh flags and micro-batches; the tracer when NANSCOPE_TRACE_STEP names this step."""
        self._stop_trace()  # a traced step that ended before its backward (an exception)
        self.step = _Step(args, {"rollout_id": rollout_id, "step_id": step_id})
        self.step_start = None
        self.skip.begin()
        self._new_pass()
        if self.settings.trace_step == (rollout_id, step_id):
            self.trace = self._start_trace(args, rollout_id)

    def _new_pass(self) -> None:
        self.sentinel.reset()
        self.deferred.begin()
        self.gate.new_pass()
        self.losses.begin()
        self.forwards = [0] * len(self.chunks)
        for grads in self.out_grads:
            grads.clear()

    def _start_trace(self, args, rollout_id):
        from nanscope.dumps.io import load_rollout  # heavy: numpy; only a traced step reads a dump
        from nanscope.trace.tracer.step import StepTrace  # heavy: torch

        path = getattr(args, "load_debug_rollout_data", None)
        rollout = load_rollout(path.format(rollout_id=rollout_id)) if path else None
        trace = StepTrace(self.chunks, rollout, self.coords.cp_rank, self.coords.cp_size, warn=warn)
        trace.start()
        return trace

    def _count_forward(self, chunk: int):
        def hook(module, args):
            if module.training:
                self.forwards[chunk] += 1

        return hook

    def _watch_output(self, chunk: int):
        """The class needs to know whether the gradient entering the chunk (from the loss or the next stage) was
        already non-finite: two reductions per micro-batch into 0-dim tensors, no host sync, nothing the size of
        the gradient (`torch.isfinite(g).all()` would make a boolean as large as the logits' gradient)."""
        import torch  # heavy: torch, imported by the run already

        grads = self.out_grads[chunk]

        def finite(g):
            if g.numel():
                grads.append(torch.isfinite(torch.stack(torch.aminmax(g.detach()))).all())  # NaN propagates

        def hook(module, args, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            if module.training and isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(finite)

        return hook

    def _observe(self):
        """This pass's sentinel reading and the step's vote, read to the host together: the step's one sync."""
        values = self.sentinel.pending(grads=True)
        bad = self.sentinel.nonfinite(values)
        if self.deferred.error is not None:  # megatron's own check failed in the backward (overlapped reduce)
            bad = bad | True
        vote = step_vote.exchange(bad, self.coords, self._headroom(), own=values, counters=self._counters())
        return self.sentinel.finish(vote.carried, grads=True), vote

    def _decide(self) -> str:
        """At the first finish_grad_sync of a pass (the gate asks): what every chunk's does, OPEN or HOLD."""
        if self.overlapped:  # the reduces the backward issued finish first: the buffers are final on every rank
            wait(self.chunks)
        reading, vote = self._observe()
        step = self.step
        if step.first is not None:
            return self._after_rerun(reading, vote)
        if self.trace is not None:  # the traced step's trace is its first pass's
            self.write_trace()
        if not vote.bad:
            self._end_step(vote, skip=False)
            return OPEN
        step.first, cls = self._sight(reading)  # non-finite: what every rank saw
        if step.first[self.coords.rank].saw:  # reported, before anything else can fail
            step.report = self.reporter.write(
                reading, cls, seen=self.losses.seen, target=self.losses.target, args=step.args, where=step.where,
                rows=self._rows,
            )  # fmt: skip
        if self.settings.rerun == "on" and self.schedule.active:
            step.rerun_pending = True
            self._drain()
            return HOLD
        return self._conclude(vote, None, step.first)

    def begin_rerun(self, started: float) -> None:
        """Between the passes (the schedule watch calls it): the second pass is observed afresh."""
        self.step.rerun_pending, self.step.rerun_started = False, started
        self._new_pass()
        self.optimizer.zero_grad()

    def _after_rerun(self, reading, vote) -> str:
        """The rerun's pass: the verdict on both passes, added to the report; then raise, skip or go on."""
        step, rank = self.step, self.coords.rank
        again, _ = self._sight(reading)
        found = verdict.decide(step.first, again, rank, step.rerun_started)
        if step.report is not None:
            self.reporter.add_verdict(step.report, found)
        if step.first[rank].saw or self.coords.logs:
            say(found.line())
        errors = [f if f.error else a for f, a in zip(step.first, again)]  # a rank's first error, else the rerun's
        return self._conclude(vote, found, errors)

    def _conclude(self, vote, found, sightings) -> str:
        """Raise, skip or go on (`ending`), the same on every rank."""
        what = ending.outcome(self.settings, found, sightings)
        if what == ending.GO_ON:
            self._end_step(vote, skip=False)
            return OPEN
        self._drain()
        if what == ending.SKIP:
            self._end_step(vote, skip=True)
            return HOLD
        raise ending.error(self.coords.rank, self.step.where, sightings, found, self.step.report)

    def _drain(self) -> None:
        """Forget the reduces the backward pass issued (--overlap-grad-reduce) before the gradients are zeroed."""
        if self.overlapped:
            drain(self.chunks)

    def _sight(self, reading):
        """(every rank's sighting of this pass, this rank's classification or None): one all-gather."""
        saw = not reading.finite or self.deferred.error is not None
        # With the reduce issued in the backward pass, which backward call's screen first saw a value a peer
        # reduced in is a race: the verdict compares the rest of the reading (forward, producer, gradients)
        compared = dataclasses.replace(reading, backward=None) if self.overlapped else reading
        cls = self.classify(compared) if not reading.finite else None
        tokens = reading.expert_tokens(self.names.offset) if not reading.finite else None
        mine = nonfinite.Sighting(
            rank=self.coords.rank, pp=self.coords.pp, tp=self.coords.tp, node=nonfinite.node(),
            device=nonfinite.device(), saw=saw, summary=None if cls is None else nonfinite.summary(cls),
            order=reading.forward.order if reading.forward is not None else None,
            error=self.deferred.error or (nonfinite.megatron_error(self.chunks) if not reading.finite else None),
            finding=(tokens or {}).get("finding"),
        )  # fmt: skip
        return nonfinite.exchange(mine), cls

    def _end_step(self, vote, *, skip: bool) -> None:
        """The step's end: skip mode's skip, its count and limit, and the step's metrics logged; on the logging rank
        one line with skip mode's count and the NaN-safe loss's non-zero counters (what it dropped this step)."""
        metrics, where = dict(vote.metrics), self.step.where
        shown = {}
        if self.settings.on_nonfinite == "skip":
            self.skip.apply(skip)
            metrics["nanscope/skipped_steps"] = shown["nanscope/skipped_steps"] = self.skip.skipped
        shown |= {
            f"nanscope/{name}": metrics[f"nanscope/{name}"] for name in COUNTERS if metrics.get(f"nanscope/{name}")
        }
        if self.coords.logs and shown:
            say(f"nanscope: rollout {where['rollout_id']} step {where['step_id']}: {shown}")
        self.logger.step(self.step.args, where, metrics, vote.where)
        if self.settings.on_nonfinite == "skip" and self.skip.over_limit():
            raise RuntimeError(
                f"nanscope: {self.skip.in_a_row} step(s) in a row had non-finite gradients (the last: rollout "
                f"{where['rollout_id']} step {where['step_id']}); NANSCOPE_MAX_SKIPS="
                f"{self.skip.max_skips}: stopping the run. Reports: {os.path.abspath(self.settings.report_dir)}"
            )

    @property
    def rerun_pending(self) -> bool:
        """The schedule watch's question after a pass: run it again."""
        return self.step.rerun_pending

    def _rows(self, microbatch: int | None) -> tuple[list | None, str]:
        """The rollout-dump rows of this step's micro-batch `microbatch` (`rows`)."""
        recipe = self.losses.target.release.rows_recipe
        return rows.rows(recipe, self.step_start, microbatch, self.coords, self.step.args)

    def _headroom(self):
        """This rank's headroom row; a failure to measure is a warning and an empty row (the vote must happen)."""
        try:
            return headroom.measure(self.losses.seen, self.losses.target, self._device())
        except Exception as e:  # nanscope's own failure: never the end of the run, never a rank out of the vote
            warn(f"rank {self.coords.rank}: could not measure the step's headroom: {type(e).__name__}: {e}")
            return headroom.empty(self._device())

    def _counters(self) -> step_vote.Counters:
        """The step's nan_guard/* counts from the plugin's loss (zeros when it did not run here), on the device."""
        device = self._device()
        try:
            parts = [seen.counts for seen in self.losses.seen if seen.counts is not None]
            return step_vote.Counters.total(COUNTERS, parts, device)
        except Exception as e:  # nanscope's own failure: the row keeps its length, the rank its place in the vote
            warn(f"rank {self.coords.rank}: could not add up the loss's counters: {type(e).__name__}: {e}")
            return step_vote.Counters.total(COUNTERS, [], device)

    def _device(self):
        """Where the step's numbers live: the model's parameters' device."""
        return next(self.chunks[0].parameters()).device

    def classify(self, reading):
        """This pass's reading's class of cause (trace.sentinels.classify), in public names; the loss inputs are those
        the policy loss received."""
        batches = [seen.batch for seen in self.losses.seen]
        inputs = nonfinite_counts(batches, PER_TOKEN) if self.coords.last_stage and batches else None
        # the gradient entering the model from outside this rank: the loss's (the last chunk of the last stage),
        # or the next pipeline stage's
        entering = self.out_grads[-1] if self.coords.last_stage else [g for gs in self.out_grads for g in gs]
        obs = Observation(
            forward=self.names.hit(reading.forward),
            backward=self.names.hit(reading.backward),
            grads=tuple(self.names.name(g) for g in reading.grads),
            loss_inputs=inputs,
            output_grad_finite=all(bool(g) for g in entering) if entering else None,
            last_stage=self.coords.last_stage,
        )
        return classify(obs)

    def write_trace(self) -> str:
        """`<stem>.trace.json`: this rank's trace and the first producer over all ranks (an all-gather)."""
        import torch.distributed as dist  # heavy: torch, imported by the run already

        from nanscope.trace.tracer.step import first_across_ranks  # heavy: torch, only a traced step needs it

        microbatches = self.trace.microbatches
        own = self._stop_trace().to_dict()
        mine = {"rank": self.coords.rank, "pp": self.coords.pp, "tp": self.coords.tp, "trace": own}
        records = [mine]
        if dist.is_initialized():
            records = [None] * dist.get_world_size()
            dist.all_gather_object(records, mine)
        first = first_across_ranks(records)
        where = self.step.where
        doc = {
            **mine,
            **where,
            "microbatch_samples": microbatches,
            "rollout_data": getattr(self.step.args, "load_debug_rollout_data", None),
            "first": first,
        }
        path = self.files.trace(doc, where)
        if self.coords.rank == 0:
            head = f"nanscope trace of rollout {where['rollout_id']} step {where['step_id']} (all ranks):"
            say("\n".join([head] + ["  " + line for line in first_lines(first)]))
        return path


def _agree_on_report_dir(report_dir: str) -> None:
    """Refuse a report directory that cannot take reports, on every rank at once (one collective at install).

    A node-local directory may fail on some ranks only; a rank that raised alone would leave the others waiting.
    """
    problem = check_dir(report_dir)
    (anywhere,) = all_reduce_max([1.0 if problem else 0.0])
    if anywhere:
        raise ValueError(problem or f"NANSCOPE_REPORT_DIR={report_dir!r}: another rank cannot write reports there")
