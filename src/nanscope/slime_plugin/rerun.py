"""Hardware or data? A non-finite step is run again, once, on every rank: the machinery of the second pass.

The trigger is the step's vote (`step_vote`), taken where every rank arrives before Megatron's own gradient
check: the gate on every chunk's finish_grad_sync (`gate`). When the vote finds a non-finite value, every rank
holds Megatron's check back (a rerun from inside it would deadlock: healthy replicas already wait in the
data-parallel collective), and the schedule call returns. The schedule is intercepted where slime obtains it:
each step slime calls `get_forward_backward_func()` from its model module (`slime.backends.megatron_utils.model`,
every release here; nanscope's harness: `nanscope.megatron.step`), so the plugin replaces that module attribute
with one that returns a wrapper around the real schedule. Around the first pass the wrapper records what a pass
advances; if the vote asked for it, it zeroes the gradient buffers, restores that state and runs the schedule
again, with the sentinel on, before the optimizer step (nothing has touched the parameters):

    data iterators  each `offset` (slime's DataIterator, one per model chunk; the harness's micro-batches)
    RNG             torch's CPU and CUDA states, megatron's CUDA RNG tracker
    routing replay  forward_index and backward_index of every slime RoutingReplay (v0.2.4 on)
    MoE routers     expert_bias and local_tokens_per_expert (megatron updates them inside the schedule)

The verdict on the two passes is `verdict`'s.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time

from nanscope.slime_plugin.rows import StepStart

_MISSING = object()


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
