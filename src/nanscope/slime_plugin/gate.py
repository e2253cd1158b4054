"""Where the plugin stands in megatron's step: every model chunk's finish_grad_sync, held or let through together.

megatron-core 0.15's finalize_model_grads calls `finish_grad_sync()` on every model chunk in turn (one chunk per
virtual pipeline stage, distributed/finalize_model_grads.py:421-422); each runs DDP's bucket check and the
data-parallel reduce (param_and_grad_buffer.py:319-467). The gate wraps each chunk's: the first call of a pass
(a run of the schedule) asks `decide()` once, and its answer holds for every chunk of that pass:

    OPEN   megatron's own finish_grad_sync runs on every chunk (its check, its reduce), as without nanscope
    HOLD   none runs: the step is run again, or skipped (gradients zeroed); no rank enters the data-parallel
           collective, so none waits there for one that did not

With --overlap-grad-reduce the reduce is issued inside the backward pass, bucket group by bucket group, and
finish_grad_sync only waits for it. `wait` lets it finish before the sentinel is read (a replica's gradients
then hold what its peers reduced in, the same on both passes of a rerun), and `drain` forgets it before a held
pass's gradients are zeroed (zeroing under a reduce-scatter in flight races it, and the rerun's backward would
find megatron's `grad_reduce_handle` still set: param_and_grad_buffer.py:328-330). Megatron's own bucket check runs there too,
inside the backward, where an error would end one rank while its data-parallel peers wait in the reduce:
`DeferredCheck` keeps that error (megatron's own text) for the vote instead, and lets the reduce go out.
"""

from __future__ import annotations

OPEN, HOLD = "open", "hold"
_MISSING = object()


class Gate:
    """Every chunk's finish_grad_sync wrapped; `decide()` is asked at the first call of each pass."""

    def __init__(self, chunks, decide):
        self.chunks, self.decide = chunks, decide
        self.decision: str | None = None  # this pass's, once decided
        self._wrapped: list[tuple] = []  # (chunk, its previous instance value, our wrapper)
        for chunk in chunks:
            previous = vars(chunk).get("finish_grad_sync", _MISSING)
            wrapper = self._wrap(chunk.finish_grad_sync)
            chunk.finish_grad_sync = wrapper
            self._wrapped.append((chunk, previous, wrapper))

    def new_pass(self) -> None:
        self.decision = None

    def _wrap(self, finish_grad_sync):
        def wrapped(*args, **kwargs):
            if self.decision is None:
                self.decision = self.decide()
            if self.decision == HOLD:
                return None
            return finish_grad_sync(*args, **kwargs)

        return wrapped

    def remove(self) -> None:
        """Put each chunk's finish_grad_sync back (unless someone wrapped it again since)."""
        for chunk, previous, wrapper in reversed(self._wrapped):
            if vars(chunk).get("finish_grad_sync") is wrapper:
                delattr(chunk, "finish_grad_sync") if previous is _MISSING else setattr(
                    chunk, "finish_grad_sync", previous
                )
        self._wrapped.clear()


def bucket_groups(chunks) -> list:
    """Every DDP bucket group of the chunks (dense, then expert-parallel)."""
    groups = []
    for chunk in chunks:
        groups += list(getattr(chunk, "bucket_groups", [])) + list(getattr(chunk, "expert_parallel_bucket_groups", []))
    return groups


def overlapped(chunks) -> bool:
    """megatron's DDP issues the reduce inside the backward pass (--overlap-grad-reduce)."""
    return any(bool(getattr(getattr(c, "ddp_config", None), "overlap_grad_reduce", False)) for c in chunks)


def wait(chunks) -> None:
    """Wait for every reduce the backward pass issued (--overlap-grad-reduce), leaving megatron's handles set:
    every rank's gradient buffers are then final (a peer's values reduced in) before the sentinel reads them, and
    megatron's own finish_grad_sync, if the gate opens, waits on a finished reduce (no extra wait, no sync)."""
    for group in bucket_groups(chunks):
        handle = getattr(group, "grad_reduce_handle", None)
        if handle is not None:
            handle.wait()


def drain(chunks) -> None:
    """`wait`, then forget the handles, as megatron's finish_grad_sync would, without its check: a held pass's
    gradients can then be zeroed and the rerun's backward issue its reduces afresh."""
    wait(chunks)
    for group in bucket_groups(chunks):
        if getattr(group, "grad_reduce_handle", None) is not None:
            group.grad_reduce_handle = None


class DeferredCheck:
    """megatron's bucket check inside the backward pass (--overlap-grad-reduce with the check on), kept for the
    vote: `error` holds the first error it raised this pass (megatron's own text), and the reduce goes out."""

    def __init__(self, chunks):
        self.error: str | None = None
        self._wrapped: list[tuple] = []
        for chunk in chunks:
            config = getattr(chunk, "ddp_config", None)
            checks = getattr(config, "check_for_nan_in_grad", False) or getattr(config, "check_for_large_grads", False)
            if not (getattr(config, "overlap_grad_reduce", False) and checks):
                continue
            for group in bucket_groups([chunk]):
                previous = vars(group).get("check_grads", _MISSING)
                wrapper = self._wrap(group.check_grads)
                group.check_grads = wrapper
                self._wrapped.append((group, previous, wrapper))

    @property
    def active(self) -> bool:
        return bool(self._wrapped)

    def begin(self) -> None:
        self.error = None

    def _wrap(self, check_grads):
        def wrapped(*args, **kwargs):
            try:
                return check_grads(*args, **kwargs)
            except RuntimeError as e:  # megatron's RerunStateMachine: "Rank R, ...: Unexpected result nan (...)"
                if self.error is None:
                    self.error = str(e)
                return None

        return wrapped

    def remove(self) -> None:
        for group, previous, wrapper in reversed(self._wrapped):
            if vars(group).get("check_grads") is wrapper:
                delattr(group, "check_grads") if previous is _MISSING else setattr(group, "check_grads", previous)
        self._wrapped.clear()
