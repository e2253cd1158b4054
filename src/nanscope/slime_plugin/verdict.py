"""Hardware or data? The rerun's verdict, from every rank's sighting of both passes (`nonfinite.exchange`).

    reproducible       every rank's rerun sees its first non-finite value at the same module, micro-batch and
                       class as the first pass (the data or the numerics, or a device that fails every time)
    not reproducible   anything else: the rerun is finite, or non-finite elsewhere

A rerun that does not reproduce rules out the data and the numerics, not every software cause. What it cannot
rule out is said (`not_ruled_out`), and such a step is not "transient" for NANSCOPE_SKIP_ON=transient:

    a zero-token expert    the first pass's reading names one (`trace.sentinels.expert_counts`): its weight gradient is
                           memory a grouped GEMM never wrote, NaN only when the allocator hands back memory that
                           held one (catalogue: moe-zero-token-expert)
    nondeterminism         the rerun is non-finite again, elsewhere: a kernel whose result depends on run order
                           (atomics), or memory read before it was written, not a one-time device fault

Every rank holds every sighting, so every rank decides the same verdict without another collective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from nanscope.slime_plugin import nonfinite
from nanscope.slime_plugin.nonfinite import Sighting

REPRODUCIBLE = "reproducible"
TRANSIENT = "not reproducible"


@dataclass(frozen=True)
class Verdict:
    """The rerun's outcome, as seen from one rank.

    Attributes:
        verdict: REPRODUCIBLE or TRANSIENT (the same on every rank).
        first, rerun: this rank's reading of each pass ({"module", "direction", "microbatch", "class"}, or
            None where the pass was finite on this rank).
        producer: the first producer across ranks in the first pass ({"rank", "node", "device", "module", ...}).
        seconds: the rerun's wall time.
        not_ruled_out: causes other than a transient fault the rerun could not rule out, one line each.
    """

    verdict: str
    first: dict | None
    rerun: dict | None
    producer: dict | None
    seconds: float
    not_ruled_out: tuple[str, ...] = ()

    @property
    def skippable(self) -> bool:
        """NANSCOPE_SKIP_ON=transient skips this step: not reproducible, and nothing else is left open."""
        return self.verdict == TRANSIENT and not self.not_ruled_out

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "first": self.first, "rerun": self.rerun, "producer": self.producer,
                "seconds": self.seconds, "not_ruled_out": list(self.not_ruled_out)}  # fmt: skip

    def line(self) -> str:
        """The one line that states it (nothing unknown is printed as None)."""
        if self.verdict == REPRODUCIBLE:
            where = _place(self.first) if self.first else _place(self.producer, rank=True)
            return (
                f"nanscope: rerun: reproducible on this device: the rerun of the step is non-finite again at {where}: "
                f"the data or the numerics (or a device that fails every time)"
            )
        rerun = "finite" if self.rerun is None else "non-finite elsewhere"
        if self.not_ruled_out:
            return (
                f"nanscope: rerun: not reproducible, but not only a transient fault: the rerun of the step is {rerun}; "
                f"{_producer(self.producer)}; not ruled out: {'; '.join(self.not_ruled_out)}: look there before the "
                f"hardware; NANSCOPE_SKIP_ON=transient does not skip this step"
            )
        return (
            f"nanscope: rerun: not reproducible (transient): the rerun of the step is {rerun}; "
            f"{_producer(self.producer)}: check dmesg for XID and ECC errors, burn in that device, set "
            f"TORCH_NCCL_NAN_CHECK=1 on the next run; a skip here is safe to repeat"
        )


def decide(first: list[Sighting], again: list[Sighting], rank: int, started: float) -> Verdict:
    """The verdict from every rank's sighting of the first pass and of the rerun (rank order, both)."""
    differs = any(f.summary != a.summary for f, a in zip(first, again)) or (
        nonfinite.bad_ranks(first) != nonfinite.bad_ranks(again)
    )
    found = nonfinite.producer(first)
    producer = None
    if found is not None:
        producer = {"rank": found.rank, "pp": found.pp, "tp": found.tp, "node": found.node, "device": found.device,
                    **found.summary}  # fmt: skip
    return Verdict(
        verdict=TRANSIENT if differs else REPRODUCIBLE,
        first=first[rank].summary,
        rerun=again[rank].summary,
        producer=producer,
        seconds=time.time() - started,
        not_ruled_out=_not_ruled_out(first, again) if differs else (),
    )


def _not_ruled_out(first: list[Sighting], again: list[Sighting]) -> tuple[str, ...]:
    found = []
    for s in first + again:
        text = f"a zero-token expert: {s.finding} (rank {s.rank})"
        if s.finding and text not in found:
            found.append(text)
    elsewhere = nonfinite.producer(again)
    if elsewhere is not None:
        found.append(
            f"nondeterminism (a kernel whose result depends on run order, or memory read before it was written): "
            f"the rerun is non-finite again at {_place(elsewhere.summary)}, on rank {elsewhere.rank}"
        )
    return tuple(found)


def _place(where: dict | None, rank: bool = False) -> str:
    """'MODULE (DIRECTION, micro-batch M, class C)' of a summary; 'an unnamed place' when there is none."""
    if not where or where.get("module") is None:
        return "an unnamed place (no rank's reading names a module)"
    on = f", rank {where['rank']}" if rank and "rank" in where else ""
    return (
        f"{where['module']} ({where.get('direction') or 'direction unknown'}, micro-batch "
        f"{_known(where.get('microbatch'))}{on}, class {where.get('class') or 'not decided on this rank'})"
    )


def _producer(p: dict | None) -> str:
    if not p:
        return "first producer: not found (no rank's reading names a module)"
    return f"first producer: rank {p['rank']}, node {p['node']}, device {p['device']} ({p.get('module')})"


def _known(value) -> str:
    return "unknown" if value is None else str(value)
