"""Hardware or data? A non-finite step is run again, once, on every rank, and the two readings compared.

The trigger is the step's vote (`step_vote`), taken where every rank arrives before Megatron's own gradient
check: the wrapper of finish_grad_sync. When the vote finds a non-finite value, every rank defers Megatron's
check (a rerun from inside it would deadlock: healthy replicas already wait in the data-parallel collective),
and the schedule call returns. The schedule is intercepted where slime obtains it: each step slime calls
`get_forward_backward_func()` from its model module (`slime.backends.megatron_utils.model`, every release here;
nanscope's harness: `nanscope.megatron.step`), so the plugin replaces that module attribute with one that
returns a wrapper around the real schedule. Around the first pass the wrapper records what a pass advances; if
the vote asked for it, it zeroes the gradient buffers, restores that state and runs the schedule again, with the
sentinel on, before the optimizer step (nothing has touched the parameters):

    data iterators  each `offset` (slime's DataIterator; the harness's micro-batches)
    RNG             torch's CPU and CUDA states, megatron's CUDA RNG tracker
    routing replay  forward_index and backward_index of every slime RoutingReplay (v0.2.4 on)
    MoE routers     expert_bias and local_tokens_per_expert (megatron updates them inside the schedule)

The verdict (`Verdict`): reproducible when every rank's rerun sees its first non-finite value at the same
module, micro-batch and class, else not reproducible (transient). The ranks agree on it through one all-reduce.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from dataclasses import dataclass

from nanscope.facts.megatron import BUCKET_NONFINITE, UNEXPECTED_RESULT
from nanscope.slime_plugin.rows import StepStart
from nanscope.trace.observe import causal_order

_MISSING = object()
REPRODUCIBLE = "reproducible"
TRANSIENT = "not reproducible"


@dataclass(frozen=True)
class Verdict:
    """The rerun's outcome on this rank.

    Attributes:
        verdict: REPRODUCIBLE or TRANSIENT (the same on every rank).
        first, rerun: this rank's reading of each pass ({"module", "direction", "microbatch", "class"}, or
            None where the pass was finite).
        producer: the first producer across ranks in the first pass ({"rank", "node", "device", "module", ...}).
        seconds: the rerun's wall time.
    """

    verdict: str
    first: dict | None
    rerun: dict | None
    producer: dict | None
    seconds: float

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "first": self.first, "rerun": self.rerun, "producer": self.producer,
                "seconds": self.seconds}  # fmt: skip

    def line(self) -> str:
        """The one line that states it."""
        if self.verdict == REPRODUCIBLE:
            where = self.first or {}
            return (
                f"nanscope: rerun: reproducible on this device: the rerun of the step is non-finite again at "
                f"{where.get('module')} ({where.get('direction')}, micro-batch {where.get('microbatch')}, class "
                f"{where.get('class') or 'not decided on this rank'}): the data or the numerics (or a device that "
                f"fails every time)"
            )
        p = self.producer or {}
        return (
            f"nanscope: rerun: not reproducible (transient): the rerun of the step is "
            f"{'finite' if self.rerun is None else 'non-finite elsewhere'}; first producer: rank {p.get('rank')}, "
            f"node {p.get('node')}, device {p.get('device')} ({p.get('module')}): check dmesg for XID and ECC "
            f"errors, burn in that device, set TORCH_NCCL_NAN_CHECK=1 on the next run; a skip here is safe to repeat"
        )


class StepState:
    """What one pass of the schedule advances, recorded before it and put back before the rerun."""

    def __init__(self, routers: list, data_iterator):
        """`routers`: `router_state(chunks)`, found once per installation."""
        import torch  # heavy: torch, imported by the run already

        self.iterators = [(it, it.offset) for it in _iterators(data_iterator) if hasattr(it, "offset")]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.python_rng = random.getstate()
        self.tracker = _tracker_states()
        self.replays = [(r, r.forward_index, r.backward_index) for r in _routing_replays()]
        self.routers = [(m, {n: getattr(m, n).detach().clone() for n in names}) for m, names in routers]

    def restore(self) -> None:
        import torch  # heavy: torch, imported by the run already

        for it, offset in self.iterators:
            it.offset = offset
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        if self.tracker is not None:
            _tracker().set_states(self.tracker)
        for replay, forward, backward in self.replays:
            replay.forward_index, replay.backward_index = forward, backward
        for module, saved in self.routers:
            with torch.no_grad():
                for name, value in saved.items():
                    getattr(module, name).copy_(value)


def _iterators(data_iterator) -> list:
    return list(data_iterator) if isinstance(data_iterator, (list, tuple)) else [data_iterator]


ROUTER_STATE = ("expert_bias", "local_tokens_per_expert")  # MoE router tensors megatron updates in the schedule


def router_state(chunks) -> list[tuple[object, tuple[str, ...]]]:
    """(module, the ROUTER_STATE names it holds as tensors) over the chunks' modules. Found once per installation:
    a per-step walk would pay nn.Module's failing __getattr__ on every module of the model, every step."""
    import torch  # heavy: torch, imported by the run already

    found = []
    for chunk in chunks:
        for module in chunk.modules():
            names = tuple(n for n in ROUTER_STATE if isinstance(getattr(module, n, None), torch.Tensor))
            if names:
                found.append((module, names))
    return found


def _tracker():
    module = sys.modules.get("megatron.core.tensor_parallel.random")
    return None if module is None else module.get_cuda_rng_tracker()


def _tracker_states():
    tracker = _tracker()
    with contextlib.suppress(Exception):  # a tracker without states (never seeded): nothing to restore
        return tracker.get_states() if tracker is not None else None
    return None


def _routing_replays() -> list:
    """slime's RoutingReplay objects (v0.2.4 on), if slime's module is loaded."""
    module = sys.modules.get("slime.utils.routing_replay")
    return list(getattr(getattr(module, "RoutingReplay", None), "all_routing_replays", []) or [])


class ScheduleWatch:
    """Replaces the model module's `get_forward_backward_func` with one whose schedule can run a step twice."""

    def __init__(self, module_name: str | None, chunks, rerun_step):
        self.chunks, self.rerun_step = chunks, rerun_step
        self.routers = router_state(chunks)
        self.module = sys.modules.get(module_name) if module_name else None
        self.active = False  # a training schedule call of this step is running (a rerun is possible)
        self._previous = _MISSING
        if self.module is not None and hasattr(self.module, "get_forward_backward_func"):
            self._previous = vars(self.module).get("get_forward_backward_func", _MISSING)
            self._original = self.module.get_forward_backward_func
            self._wrapper = self._obtain
            self.module.get_forward_backward_func = self._wrapper

    @property
    def installed(self) -> bool:
        return self._previous is not _MISSING

    def remove(self) -> None:
        if self.installed and vars(self.module).get("get_forward_backward_func") is self._wrapper:
            self.module.get_forward_backward_func = self._previous

    def _obtain(self, *args, **kwargs):
        schedule = self._original(*args, **kwargs)

        def forward_backward(*call_args, **call_kwargs):
            if call_kwargs.get("forward_only", False):
                return schedule(*call_args, **call_kwargs)
            data_iterator = call_kwargs.get("data_iterator")
            state = StepState(self.routers, data_iterator)
            first = _iterators(data_iterator)[0] if data_iterator is not None else None
            self.rerun_step.step_start = StepStart(first, first.offset) if hasattr(first, "offset") else None
            self.active = True
            try:
                out = schedule(*call_args, **call_kwargs)
            finally:
                self.active = False
            if not self.rerun_step.rerun_pending:
                return out
            for chunk in self.chunks:
                chunk.zero_grad_buffer()
            state.restore()
            started = time.time()
            self.rerun_step.begin_rerun(started)
            return schedule(*call_args, **call_kwargs)

        return forward_backward


class PeerNonFinite(RuntimeError):
    """Raised on a rank whose own gradients were finite, with the ranks that saw a non-finite value: no rank is
    left waiting in a collective for one that raised."""


@dataclass
class FirstPass:
    """What the first pass of a non-finite step left, kept for the rerun's verdict and the report."""

    reading: object
    classification: object  # trace.classify's Classification of the first pass on this rank
    seen: list
    vote: object  # the first pass's step_vote.Vote
    megatron_error: str | None  # the text Megatron's check would have raised on this rank

    @property
    def summary(self) -> dict | None:
        return summary(self.classification)


def summary(classification) -> dict | None:
    """A pass's reading on this rank, as the verdict compares it (None: nothing non-finite here)."""
    if classification.finite:
        return None
    return {
        "module": classification.module,
        "direction": classification.direction,
        "microbatch": classification.microbatch,
        "class": classification.cls,
    }


def megatron_error(chunks) -> str | None:
    """The error Megatron's DDP check raises on this rank for these gradients (its first NaN or Inf bucket), from
    megatron-core 0.15's own texts (`facts.megatron`), computed without running the check: deferring it keeps
    every rank out of the data-parallel collective."""
    import torch  # heavy: torch, imported by the run already

    for chunk in chunks:
        groups = list(getattr(chunk, "bucket_groups", [])) + list(getattr(chunk, "expert_parallel_bucket_groups", []))
        for group in groups:
            for i, bucket in enumerate(group.buckets):
                norm = bucket.grad_data.norm(p=2)
                kind = "NaN" if torch.isnan(norm) else "Inf" if torch.isinf(norm) else None
                if kind is not None:
                    message = BUCKET_NONFINITE.format(kind=kind, bucket=i)
                    return _rank_prefix() + UNEXPECTED_RESULT.format(result=f"{float(norm)}", message=message)
    return None


def _rank_prefix() -> str:
    """ "Rank R, node N, device D, iteration I: " as megatron-core's rerun state machine writes it."""
    import torch  # heavy: torch, imported by the run already
    import torch.distributed as dist  # heavy: torch

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    machine = sys.modules.get("megatron.core.rerun_state_machine")
    iteration = machine.get_rerun_state_machine().current_iteration if machine is not None else -1
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    return f"Rank {rank}, node {os.uname()[1]}, device {device}, iteration {iteration}: "


def agree(first: FirstPass, rerun_summary: dict | None, rerun_bad: tuple, coords, started: float) -> Verdict:
    """The verdict every rank agrees on: one all-reduce of "my rerun differs", and the first pass's producers."""
    import torch.distributed as dist  # heavy: torch, imported by the run already

    from nanscope.slime_plugin.collectives import all_reduce_max  # heavy: torch

    differs = first.summary != rerun_summary or first.vote.bad_ranks != rerun_bad
    (any_differs,) = all_reduce_max([1.0 if differs else 0.0])
    mine = {"rank": coords.rank, "pp": coords.pp, "tp": coords.tp, "node": _node(), "device": _device(),
            **(first.summary or {})}  # fmt: skip
    # the forward check's index in the step: a TP peer sees a value it received through a collective later
    order = first.reading.forward.order if first.reading.forward is not None else None
    found = [(mine, order)]
    if dist.is_initialized():
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, (mine, order))
    seen = [(f, o) for f, o in found if f.get("module") is not None]
    producer = None
    if seen:
        producer = min(
            seen,
            key=lambda fo: causal_order(
                rank=fo[0]["rank"], pp=fo[0]["pp"], forward=fo[0]["direction"] == "forward", order=fo[1]
            ),
        )[0]
    return Verdict(
        verdict=TRANSIENT if any_differs else REPRODUCIBLE,
        first=first.summary,
        rerun=rerun_summary,
        producer=producer,
        seconds=time.time() - started,
    )


def _node() -> str:
    return os.uname()[1]


def _device():
    import torch  # heavy: torch, imported by the run already

    return torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
