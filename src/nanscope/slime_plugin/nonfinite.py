"""A non-finite pass: what each rank saw, told to every rank (one all-gather of small records, bad steps only).

When the step's vote finds a non-finite value, every rank describes what it saw on this pass (a `Sighting`) and
the ranks exchange them, so each knows what the others saw: where the value was born (`producer`), and the error
Megatron's check raises on the ranks whose gradient buckets hold it (`megatron_error`), which a rank that raises
without one of its own carries instead. A rank's Megatron error is computed from its buckets with Megatron's own
texts (`facts.megatron`), without running the check: the check is followed by the data-parallel reduce, which a
healthy replica would enter alone. Under --overlap-grad-reduce the check ran in the backward pass already and
`gate.DeferredCheck` kept its text.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass

from nanscope.facts.megatron import BUCKET_NONFINITE, UNEXPECTED_RESULT
from nanscope.trace.sentinels.observe import causal_order


@dataclass(frozen=True)
class Sighting:
    """What one rank saw on one pass.

    Attributes:
        saw: its sentinel's reading was not finite.
        summary: {"module", "direction", "microbatch", "class"} of its first non-finite value (None: nothing seen).
        order: the forward check's index in the step (a TP peer sees a value it received later), or None.
        error: the error Megatron's bucket check raises on this rank (None: its check passes, or is off).
        finding: a cause a rerun cannot decide, named by the reading (a zero-token expert), or None.
    """

    rank: int
    pp: int
    tp: int
    node: str
    device: int | str  # the CUDA device's index, or "cpu"
    saw: bool = False
    summary: dict | None = None
    order: int | None = None
    error: str | None = None
    finding: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


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


def exchange(mine: Sighting) -> list[Sighting]:
    """Every rank's sighting, in rank order (one all_gather_object over the world: every rank calls it)."""
    import torch.distributed as dist  # heavy: torch, imported by the run already

    if not dist.is_initialized():
        return [mine]
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, mine.to_dict())
    return [Sighting(**f) for f in found]


def bad_ranks(sightings: list[Sighting]) -> tuple[int, ...]:
    return tuple(s.rank for s in sightings if s.saw)


def producer(sightings: list[Sighting]) -> Sighting | None:
    """The first rank, in causal order, whose reading names a module (None: none does)."""
    named = [s for s in sightings if s.summary is not None and s.summary.get("module") is not None]
    if not named:
        return None
    return min(
        named,
        key=lambda s: causal_order(rank=s.rank, pp=s.pp, forward=s.summary["direction"] == "forward", order=s.order),
    )


def first_error(sightings: list[Sighting], rank: int) -> Sighting | None:
    """Whose Megatron error a rank raises: its own, else the first producer's, else the lowest rank's."""
    own = next((s for s in sightings if s.rank == rank and s.error), None)
    if own is not None:
        return own
    first = producer(sightings)
    if first is not None and first.error:
        return first
    return next((s for s in sightings if s.error), None)


def megatron_error(chunks) -> str | None:
    """The error Megatron's DDP check raises on this rank for these gradients (its first NaN or Inf bucket), or
    None (finite, or the check is off: --no-check-for-nan-in-loss-and-grad)."""
    import torch  # heavy: torch, imported by the run already

    for chunk in chunks:
        if not getattr(getattr(chunk, "ddp_config", None), "check_for_nan_in_grad", False):
            continue
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
    import torch.distributed as dist  # heavy: torch, imported by the run already

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    machine = sys.modules.get("megatron.core.rerun_state_machine")
    iteration = machine.get_rerun_state_machine().current_iteration if machine is not None else -1
    return f"Rank {rank}, node {node()}, device {device()}, iteration {iteration}: "


def node() -> str:
    return os.uname()[1]


def device() -> int | str:
    """The device as megatron's error names it: the current CUDA device's index, or "cpu"."""
    import torch  # heavy: torch, imported by the run already

    return torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
