"""The plugin's one collective per step: every rank's row, all-gathered over the world, and what it decides.

At the end of each step's backward pass (the gate on finish_grad_sync, which every rank reaches before
Megatron's own check) each rank contributes one row: whether its sentinel saw a non-finite value, where it sits,
and its headroom (`nanscope.slime_plugin.headroom`). One all-gather gives every rank every row, so each decides
the same thing from the same numbers. The table and the rank's own sentinel flags come to the host in one copy:
the only host sync the plugin adds to a healthy step.

    bad_ranks   the ranks whose sentinel saw a non-finite value (skip mode skips when there is any)
    metrics     nanscope/* over the data-parallel group with context parallelism on the last pipeline stage
                (TP rank 0: its TP peers compute the same loss): maxima as maxima, carried with the rank,
                micro-batch and sample that hold them; the gap's mean from sums and counts; its 99th
                percentile as the maximum of the ranks' 99th percentiles; a block of counters (`Counters`,
                e.g. the NaN-safe loss's nan_guard/*) as sums, nanscope/<name> each

slime would average these (it sums a loss metric over micro-batches, all-reduces with SUM over DP x CP and
divides), which a maximum does not survive, and reads each of a micro-batch's metrics to the host to pack them
(`torch.tensor([n] + list(log.values()), device=...)`, loss.py in every release): a count that rides in the row
instead costs no host read of its own.

Public surface: `exchange`, `decide`, `Vote`, `Counters` (any plugin's block of per-step counts: its names, the
same on every rank, fix the row's length), `ROW` (the row's fixed head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from nanscope.loss import devices
from nanscope.slime_plugin import collectives
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.headroom import FIELDS, MAXIMA

_HEAD = ("bad", "rank", "last_stage", "tp")
ROW = _HEAD + FIELDS

# metric name -> (kind, field): what each nanscope/* metric is, over the group
METRICS = {
    "nanscope/max_kl_log_ratio": "kl",
    "nanscope/max_ppo_log_ratio": "ppo",
    "nanscope/max_tis_log_ratio": "tis",
    "nanscope/train_rollout_gap_max": "gap",
}


@dataclass(frozen=True)
class Counters:
    """A block of counts one rank added up over the step, on the device: summed over the vote's group and logged as
    `nanscope/<name>` (None where no rank of the group counted any this step).

    Attributes:
        names: the block's names, the same on every rank (they fix the row's length), e.g. "nan_guard/advantages".
        values: [len(names)] float32 on the device: this rank's sums over the step.
        counted: how many calls (micro-batches) this rank's `values` add up, a host number (0: none this step).
    """

    names: tuple[str, ...]
    values: torch.Tensor
    counted: int

    @classmethod
    def total(cls, names: tuple[str, ...], parts: list[torch.Tensor], device) -> Counters:
        """The sum of the step's per-call [len(names)] tensors (stacked on the device: no host read); none: zeros."""
        if not parts:
            return cls(names, torch.zeros(len(names), device=device), 0)
        return cls(names, torch.stack([p.to(device) for p in parts]).sum(dim=0), len(parts))


@dataclass(frozen=True)
class Vote:
    """What the step's rows decide (the module docstring).

    Attributes:
        where: metric -> {"rank", "microbatch", "sample"} of the rank and sample that hold a maximum.
        carried: the caller's own numbers (`exchange`'s `own`), read to the host in the same copy.
    """

    bad_ranks: tuple[int, ...]
    metrics: dict[str, float | None] = field(default_factory=dict)
    where: dict[str, dict] = field(default_factory=dict)
    carried: list[float] = field(default_factory=list)

    @property
    def bad(self) -> bool:
        return bool(self.bad_ranks)


def exchange(
    bad, coords: Coords, headroom: torch.Tensor, own: torch.Tensor | None = None, counters: Counters | None = None
) -> Vote:
    """All-gather this rank's row over the world (one collective) and decide, with one copy to the host.

    Args:
        bad: this rank saw a non-finite value (a bool, or a 0-dim tensor on the device: no sync to make it).
        headroom: this rank's headroom row (`headroom.measure`), on the device.
        own: numbers of the caller's (the sentinel's flags) copied to the host with the table: `Vote.carried`.
        counters: the step's counts to add up over the group (every rank passes the same names, or none).
    """
    device = headroom.device
    place = [float(coords.rank), float(coords.last_stage), float(coords.tp)]  # host numbers
    block = []
    if counters is not None:
        place.append(float(counters.counted))
        block = [counters.values.to(device).float()]
    flag = bad.reshape(1).float() if isinstance(bad, torch.Tensor) else torch.full((1,), float(bad), device=device)
    row = torch.cat([flag.to(device), devices.to_device(torch.tensor(place), device), headroom.float(), *block])
    if dist.is_initialized():
        mine = row.to(collectives.device())
        rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(rows, mine)
        table = torch.stack(rows)
    else:
        table = row.reshape(1, -1)
    flat = table.reshape(-1).double()
    if own is not None:
        flat = torch.cat([flat, own.to(flat.device).double().reshape(-1)])
    values = flat.cpu().tolist()  # the step's one host sync
    n, names = table.numel(), _row(counters)
    rows_ = [values[i : i + len(names)] for i in range(0, n, len(names))]
    vote = decide([dict(zip(names, r)) for r in rows_], counters.names if counters is not None else ())
    return Vote(vote.bad_ranks, vote.metrics, vote.where, values[n:])


def _row(counters: Counters | None) -> tuple[str, ...]:
    """The names of a row's entries: the fixed ROW, then the counter block's (with how many calls it counts)."""
    if counters is None:
        return ROW
    return ROW[: len(_HEAD)] + ("counted",) + ROW[len(_HEAD) :] + counters.names


def decide(rows: list[dict[str, float]], counters: tuple[str, ...] = ()) -> Vote:
    """The vote from every rank's row (pure: the same rows give the same vote on every rank); `counters`: the names
    of the rows' counter block, summed over the group."""
    bad = tuple(sorted(int(r["rank"]) for r in rows if r["bad"]))
    group = [r for r in rows if r["last_stage"] and r["tp"] == 0]
    metrics, where = {}, {}
    for name, kind in METRICS.items():
        top = _largest(group, kind)
        metrics[name] = None if top is None else top[f"{kind}_value"]
        if top is not None:
            where[name] = {
                "rank": int(top["rank"]),
                "microbatch": int(top[f"{kind}_microbatch"]),
                "sample": int(top[f"{kind}_sample"]),
            }
    count = sum(r["gap_count"] for r in group)
    metrics["nanscope/train_rollout_gap_mean"] = sum(r["gap_sum"] for r in group) / count if count else None
    p99 = [r["gap_p99"] for r in group if r["gap_count"]]
    metrics["nanscope/train_rollout_gap_p99"] = _max(p99) if p99 else None  # the largest rank's p99
    metrics["nanscope/clamped_tokens"] = sum(r["clamped"] for r in group) if group else None
    metrics["nanscope/nonfinite_inputs"] = sum(r["nonfinite_inputs"] for r in group) if group else None
    counted = any(r["counted"] for r in group) if counters else False
    for name in counters:
        metrics[f"nanscope/{name}"] = sum(r[name] for r in group) if counted else None
    return Vote(bad, metrics, where)


def _largest(group: list[dict], kind: str) -> dict | None:
    """The row holding the largest `kind` maximum (a NaN is the largest), None when no row has one."""
    found = [r for r in group if r[f"{kind}_value"] != float("-inf")]
    if not found:
        return None
    nan = [r for r in found if math.isnan(r[f"{kind}_value"])]
    return nan[0] if nan else max(found, key=lambda r: r[f"{kind}_value"])


def _max(values: list[float]) -> float:
    return next((v for v in values if math.isnan(v)), max(values))


assert set(MAXIMA) == set(METRICS.values())
