"""One verl engine watched: the slime plugin's step state machine, driven from the engine subclass (`engine`).

Every state is the slime plugin's own module; this one only drives them from verl's engine methods:

    train_batch             the mini-batch cleaned (`inputs`) before verl counts its tokens, the loss function
                            observed (`LossObserver`: each call's micro-batch, the `nanscope` mode's record)
    forward_backward_batch  a watched pass (`passes`): the sentinel (nanscope.trace.sentinels) on the model, then
                            the step's vote (slime_plugin.step_vote: one all-gather over the world, the one host
                            sync) - at megatron's finalize_model_grads (slime_plugin.gate, before the
                            data-parallel reduce, as for slime) or, for FSDP, when the pass returns
    non-finite              what every rank saw (slime_plugin.nonfinite, one all_gather_object), the report and
                            bundle (`report`) before anything else can fail, the rerun with the RNG restored
                            (`RngState`: clip_cov draws torch.randperm, core_algos.py:1822), the verdict
                            (slime_plugin.verdict), then raise or skip (slime_plugin.ending)
    optimizer_step          skipped (gradients zeroed, grad_norm NaN) when the vote said skip (`Skips`)
    lr_scheduler_step       held when every optimizer step since the last one was skipped

A step here is one `train_batch` (one optimizer step): `where` = {"rollout_id": the update (lr_scheduler_step
calls so far), "step_id": the mini-batch within it}, as the report's file name and every line say.
"""

from __future__ import annotations

import os
import random
import time

import torch
import torch.distributed as dist

from nanscope.slime_plugin import ending, logs, nonfinite, step_vote, verdict
from nanscope.slime_plugin.collectives import all_reduce_max
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.gate import HOLD, OPEN, Gate, drain, overlapped, wait
from nanscope.slime_plugin.names import PublicNames
from nanscope.slime_plugin.outputs import Reports, check_dir, say, warn
from nanscope.slime_plugin.settings import Settings
from nanscope.trace.sentinels.classify import Observation, classify
from nanscope.trace.sentinels.sentinel import Sentinel
from nanscope.verl_plugin import headroom, inputs, record
from nanscope.verl_plugin.report import Reporter
from nanscope.verl_plugin.skips import Skips


class RngState:
    """What a pass draws from, recorded before it and put back before the rerun: torch's CPU and CUDA RNG, Python's."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.python = random.getstate()

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)


class LossObserver:
    """verl's loss function, observed: each call with a model output is a `record.Call` of this pass.

    It keeps `keywords` (verl's Megatron engine reads `loss_function.keywords["config"]`,
    verl/workers/engine/megatron/transformer_impl.py:1444-1445) and passes a call without `model_output`
    through (the distillation logits processor, fsdp/transformer_impl.py:1374-1375).
    """

    def __init__(self, loss_function, calls: list[record.Call]):
        self.inner, self.calls = loss_function, calls
        self.keywords = getattr(loss_function, "keywords", {})

    def __call__(self, *args, **kwargs):
        if "model_output" not in kwargs:
            return self.inner(*args, **kwargs)
        call = record.Call(microbatch=len(self.calls), batch=_batch_info(kwargs.get("data")))
        self.calls.append(call)
        with record.opened(call):
            loss, metrics = self.inner(*args, **kwargs)
        call.loss = loss.detach()
        return loss, metrics


class Watch:
    """The plugin on one engine (see the module docstring). `role`: "actor" or "critic" (reports under critic/)."""

    def __init__(self, engine, *, settings: Settings, role: str):
        self.engine, self.settings, self.role = engine, settings, role
        self.chunks = list(engine.module) if isinstance(engine.module, (list, tuple)) else [engine.module]
        self.coords = _coords(engine)
        report_dir = settings.report_dir if role == "actor" else os.path.join(settings.report_dir, role)
        _agree_on_report_dir(report_dir)
        if self.coords.rank == 0:
            for line in settings.unknown_lines():
                warn(line)
        self.sentinel = Sentinel(self.chunks)
        self.names = PublicNames(self.chunks)
        self.reporter = Reporter(Reports(report_dir, self.coords, settings.max_bundles), self.coords, settings, role)
        self.skips = Skips(settings.max_skips)
        self.update, self.minibatch = 0, 0
        self.training = False  # inside train_batch: forward_backward_batch is a watched pass
        self.calls: list[record.Call] = []
        self.counts: torch.Tensor | None = None  # the mini-batch's cleaning counts (inputs.COUNTERS)
        self.metrics: dict[str, float] = {}  # the step's nanscope/* for verl's metrics
        self._pass_vote = None  # (vote, reading, loss_bad) once this pass voted
        self._rerun = False  # this pass is a rerun (megatron's gate holds it whatever its vote)
        self.overlapped = overlapped(self.chunks)
        self.gate = Gate(self.chunks, self._at_finalize) if _megatron(self.chunks) else None

    @property
    def where(self) -> dict:
        return {"rollout_id": self.update, "step_id": self.minibatch}

    # -- train_batch ------------------------------------------------------------------------
    def begin(self, data, loss_function) -> LossObserver:
        """The start of a train_batch: clean the mini-batch (before verl counts its tokens), observe the loss."""
        self.training, self.metrics = True, {}
        self.reporter.config = getattr(loss_function, "keywords", {}).get("config")
        try:
            self.counts = inputs.clean(data)
        except Exception as e:  # nanscope's own failure: the step goes on uncleaned, as without the plugin
            warn(f"rank {self.coords.rank}: could not clean the mini-batch's inputs: {type(e).__name__}: {e}")
            self.counts = None
        return LossObserver(loss_function, self.calls)

    def end(self) -> None:
        self.training = False
        self.minibatch += 1

    def lr_step(self) -> bool:
        """lr_scheduler_step is called: True to advance the schedule (not when every step since was skipped)."""
        self.update, self.minibatch = self.update + 1, 0
        return self.skips.advance_lr()

    # -- a watched pass -----------------------------------------------------------------------
    def passes(self, run):
        """forward_backward_batch on a train_batch's mini-batch: run, vote, and on a non-finite pass the report,
        the rerun, the verdict and raise or skip (every rank the same collectives in the same order)."""
        state = RngState()
        out = self._run(run)
        vote, reading, loss_bad = self._pass_vote
        if not vote.bad:
            self._finish(vote, skip=False)
            return out
        first = self._sight(reading, loss_bad)
        report = self.reporter.write(reading, self._classify(reading), calls=self.calls, where=self.where,
                                     names=self.names) if first[self.coords.rank].saw else None  # fmt: skip
        found = None
        if self.settings.rerun == "on":
            self.engine.optimizer_zero_grad()
            state.restore()
            started = time.time()
            self._rerun = True
            try:
                self._run(run)
            finally:
                self._rerun = False
            _, again_reading, again_loss = self._pass_vote
            found = verdict.decide(first, self._sight(again_reading, again_loss), self.coords.rank, started)
            if report is not None:
                self.reporter.files.add(report, rerun=found.to_dict())
            if first[self.coords.rank].saw or self.coords.logs:
                say(found.line())
        if ending.outcome(self.settings, found, first) == ending.SKIP:
            self.engine.optimizer_zero_grad()
            self._finish(vote, skip=True)
            return out
        raise ending.error(self.coords.rank, self.where, first, found, report)

    def _run(self, run):
        """One pass of forward_backward_batch, voted on (at finalize_model_grads, or after the pass)."""
        self.sentinel.reset()
        self.calls.clear()
        self._pass_vote = None
        if self.gate is not None:
            self.gate.new_pass()
        out = run()
        if self._pass_vote is None:  # FSDP (or no gradient sync reached): vote now
            self._pass_vote = self._vote()
        return out

    def _at_finalize(self) -> str:
        """megatron's first finish_grad_sync of the pass (slime_plugin.gate): vote before the data-parallel reduce;
        a non-finite pass is held (nothing reduced, nothing reaches the weights), its rerun too."""
        if self.overlapped:
            wait(self.chunks)
        self._pass_vote = self._vote()
        if self._pass_vote[0].bad or self._rerun:  # a rerun ends in a skip or a raise: never reduced
            if self.overlapped:
                drain(self.chunks)
            return HOLD
        return OPEN

    def _vote(self):
        """(vote, reading, this rank's loss was non-finite): the sentinel's flags, the headroom row and the
        cleaning counters, all-gathered and read to the host in one copy."""
        values = self.sentinel.pending(grads=True)
        device = values.device
        losses = [c.loss for c in self.calls if c.loss is not None]
        none = torch.zeros((), dtype=torch.bool, device=device)  # no loss on this rank (not the last stage)
        loss_bad = ~torch.isfinite(torch.stack(losses).to(device)).all() if losses else none
        counts = self._counts(device)
        row = self._row(counts, device)
        counters = step_vote.Counters(inputs.COUNTERS, counts, 1)
        bad = Sentinel.nonfinite(values) | loss_bad.to(device)
        own = torch.cat([values, loss_bad.to(device).double().reshape(1)])
        vote = step_vote.exchange(bad, self.coords, row, own=own, counters=counters)
        reading = self.sentinel.finish(vote.carried[:-1], grads=True)
        return vote, reading, bool(vote.carried[-1])

    def _counts(self, device) -> torch.Tensor:
        """The mini-batch's inputs.COUNTERS with the loss mode's exp overflows, on `device`."""
        counts = (self.counts if self.counts is not None else torch.zeros(len(inputs.COUNTERS))).to(device).clone()
        over = [c.headroom.overflow.to(device) for c in self.calls if c.headroom is not None]
        if over:
            counts[inputs.COUNTERS.index("nan_guard/exp_overflow")] = torch.stack(over).sum()
        return counts

    def _row(self, counts: torch.Tensor, device) -> torch.Tensor:
        """This rank's headroom row; a failure to measure is a warning and an empty row (the vote must happen)."""
        try:
            return headroom.row(self.calls, inputs.nonfinite_entries(counts), device)
        except Exception as e:  # nanscope's own failure: never the end of the run, never a rank out of the vote
            warn(f"rank {self.coords.rank}: could not measure the step's headroom: {type(e).__name__}: {e}")
            return headroom.row([], torch.zeros((), device=device), device)

    def _sight(self, reading, loss_bad: bool) -> list[nonfinite.Sighting]:
        """Every rank's sighting of this pass (one all_gather_object). Gradients are reduced over data parallelism
        inside FSDP's backward, so a rank whose model output was finite can hold a peer's NaN: where some rank's
        forward named a module, only those ranks count as having seen it (the same rule on every rank)."""
        cls = self._classify(reading) if not reading.finite else None
        saw = not reading.finite or loss_bad
        mine = nonfinite.Sighting(
            rank=self.coords.rank, pp=self.coords.pp, tp=self.coords.tp, node=nonfinite.node(),
            device=nonfinite.device(), saw=saw, summary=None if cls is None else nonfinite.summary(cls),
            order=reading.forward.order if reading.forward is not None else None,
            error=self._error_line() if saw else None,
        )  # fmt: skip
        every = nonfinite.exchange(mine)
        forward = [s for s in every if s.summary is not None and s.summary.get("direction") == "forward"]
        if not forward:
            return every
        cleared = {"saw": False, "error": None, "summary": None, "order": None}
        return [s if s in forward else nonfinite.Sighting(**{**s.to_dict(), **cleared}) for s in every]

    def _error_line(self) -> str:
        """The line a rank that saw the value raises with last (what verl would have done instead)."""
        return (
            f"Rank {self.coords.rank}, node {nonfinite.node()}, device {nonfinite.device()}: non-finite values in the "
            f"{self.role}'s update {self.update}, mini-batch {self.minibatch} (nanscope.verl_plugin, "
            f"NANSCOPE_ON_NONFINITE={self.settings.on_nonfinite})"
        )

    def _classify(self, reading):
        obs = Observation(
            forward=self.names.hit(reading.forward),
            backward=self.names.hit(reading.backward),
            grads=tuple(self.names.name(g) for g in reading.grads),
            last_stage=self.coords.last_stage,
        )
        return classify(obs)

    def _finish(self, vote, *, skip: bool) -> None:
        """The step's end: skip mode's count and limit, the metrics for verl, the warning lines."""
        metrics = {k: v for k, v in vote.metrics.items() if v is not None}
        if self.settings.on_nonfinite == "skip":
            self.skips.record(skip)
            metrics["nanscope/skipped_steps"] = float(self.skips.skipped)
        self.metrics = metrics
        head = f"{self.role} update {self.update} mini-batch {self.minibatch}"
        if self.coords.logs:
            dropped = {k: v for k, v in metrics.items() if k.startswith("nanscope/nan_guard/") and v}
            if dropped or skip:
                say(f"nanscope: {head}: {dict(dropped, **({'skipped': True} if skip else {}))}")
            for _, text in logs.warnings_for(metrics, vote.where, self.settings):
                warn(f"{head}: {text}")
        if skip and self.skips.over_limit():
            raise RuntimeError(
                f"nanscope: {self.skips.in_a_row} step(s) in a row had non-finite values (the last: {head}); "
                f"NANSCOPE_MAX_SKIPS={self.skips.max_skips}: stopping the run. Reports: "
                f"{os.path.abspath(self.reporter.files.dir)}"
            )

    def remove(self) -> None:
        self.sentinel.remove()
        if self.gate is not None:
            self.gate.remove()


BATCH_INFO = ("dp_size", "batch_num_tokens", "global_batch_size")  # what ppo_loss normalises by (losses.py:67-70)


def _batch_info(data) -> dict:
    """The micro-batch's normalisation numbers as verl set them (host numbers already: verl read them with .item(),
    fsdp/transformer_impl.py:706-710), for the bundle's replay; those it lacks are left out."""
    out = {}
    for key in BATCH_INFO:
        try:
            value = data[key]
        except (KeyError, TypeError, AttributeError):
            continue
        if isinstance(value, (bool, int, float)) or value is None:
            out[key] = value
    return out


def _coords(engine) -> Coords:
    """This rank's place: megatron's parallel state where the engine set one up, else data parallelism only (FSDP:
    rank 0 logs, as verl's driver reads metrics from every rank but prints nothing per rank)."""
    here = Coords.here()
    if here.dp_size > 1 or here.pp or here.tp or not dist.is_initialized():
        return here
    rank = dist.get_rank()
    size = engine.get_data_parallel_size()
    return Coords(rank=rank, dp_rank=engine.get_data_parallel_rank(), dp_size=size, logs=rank == 0)


def _megatron(chunks) -> bool:
    """megatron-core DDP chunks (finish_grad_sync is where the gate sits)."""
    return all(hasattr(c, "finish_grad_sync") and hasattr(c, "zero_grad_buffer") for c in chunks)


def _agree_on_report_dir(report_dir: str) -> None:
    """Refuse a report directory that cannot take reports, on every rank at once (one collective at install)."""
    problem = check_dir(report_dir)
    (anywhere,) = all_reduce_max([1.0 if problem else 0.0])
    if anywhere:
        raise ValueError(problem or f"NANSCOPE_REPORT_DIR={report_dir!r}: another rank cannot write reports there")
