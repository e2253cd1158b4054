"""What an unset variable hides, inferred from what the other inputs say, and marked as inferred.

A launch script that reads its node count from the environment (`--actor-num-nodes $((NODES))`, `NODES=$TOTAL_NODES`)
still has a world: it holds the traceback's rank, and Megatron's layout needs it to be a multiple of TP·PP·CP
(the dense layout), of ETP·EP·PP (the expert layout) and of the GPUs per node. The smallest such world above the
rank is a lower bound, and the rank's coordinates are stated under it. When one unset variable alone sets the node
count, the script is read again with it set (`solve`), so that everything derived from it (batch sizes) follows.

    world, why = smallest_world(sizes, gpus_per_node=8, rank=50)   # 64
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from nanscope.launch.words import count

MAX_TRIED = 8  # unset variables tried one by one as the node count


@dataclass(frozen=True)
class Sizes:
    """The parallel sizes the world must be a multiple of."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int


def smallest_world(sizes: Sizes, gpus_per_node: int, rank: int | None) -> tuple[int, str]:
    """(the smallest world above `rank` the layout allows, the arithmetic in words)."""
    dense, expert = sizes.tp * sizes.pp * sizes.cp, sizes.etp * sizes.ep * sizes.pp
    unit = math.lcm(dense, expert, gpus_per_node)
    need = 1 if rank is None else rank + 1
    world = unit * -(-need // unit)
    parts = [
        f"TP{sizes.tp}·PP{sizes.pp}·CP{sizes.cp} = {dense}",
        f"ETP{sizes.etp}·EP{sizes.ep}·PP{sizes.pp} = {expert}",
    ]
    held = "the smallest world" if rank is None else f"the smallest world that holds rank {rank}"
    why = (
        f"{held}: a multiple of {', of '.join(parts)} and of {count(gpus_per_node, 'GPU')} per node (lcm {unit}), "
        f"so world >= {world}"
    )
    return world, why


def solve(
    unset: list[str], nodes: int, world: int, nodes_of: Callable[[dict[str, str]], int | None]
) -> tuple[str, str] | None:
    """(name, value) of the one unset variable that, set to the node count or the world, gives `nodes` nodes.

    Args:
        unset: the variables the script reads and never sets, in the order met.
        nodes: the node count to reach.
        world: the world, tried as the value too (`NODES=$((TOTAL_GPUS / 8))`).
        nodes_of: reads the script again with extra `--env` values and returns its node count (None: unknown).
    """
    for name in unset[:MAX_TRIED]:
        for value in dict.fromkeys((nodes, world)):
            if nodes_of({name: str(value)}) == nodes:
                return name, str(value)
    return None
