"""The ranges of the integers nanscope reads from flags and files: ranks, rollout and step ids, seeds.

A value outside its range is no value a run can have (a typo, a corrupt or hostile file): a flag's is refused in one
line (`nanscope.cli.numbers`), a file's is refused as the file's field (a repro bundle, a report) or not taken as an
id (a dump's stored rollout_id). docs/index.md lists them.
"""

from __future__ import annotations

MAX_RANK = 2**31 - 1  # a global rank (and a parallel coordinate): torch.distributed's ranks are C ints
MAX_WORLD = 2**31  # a world or group size: one more than the largest rank
MAX_ID = 2**63 - 1  # a rollout id or a step id: slime counts them in Python ints, saved as int64
MAX_SEED = 2**32 - 1  # every seed: a uint32 (the harness derives its per-step seeds from it within int64)


def in_range(value: object, low: int, high: int) -> bool:
    """`value` is an int (not a bool) from `low` to `high`, both included."""
    return type(value) is int and low <= value <= high
