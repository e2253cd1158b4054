"""Which row of the rollout dump each sample of a micro-batch is: the sample index `nanscope scan` names.

slime's batch carries no sample index, and `Sample.index` is a run-wide counter, not the row. The row follows
from the data partition and the micro-batch order of the release (`facts.releases.LossApi.rows_recipe`), read
off the data iterator the schedule received (`rerun.ScheduleWatch` sees it) at the step's start:

    strided    v0.1.0, v0.2.4, nanscope's harness: a DP rank r of d holds the samples r, r + d, r + 2d, ...
               of the dump in order (v0.1.0 slime/backends/utils/data.py:117, `val[dp_rank::dp_size]`; v0.2.4
               slime/ray/rollout.py:751-802, `range(i, N, dp)`; v0.2.4's dump is the trimmed list, so its rows
               are that list's). The rank's local sample l is row r + d * l. Micro-batch k of the step takes
               local samples [offset + k*mbs, ...) (static) or micro_batch_indices[offset + k] (dynamic).
               --balance-data partitions by sequence length instead: not derived (the rows are None).
    partition  main: the rank's rollout data keeps `partition` (slime/utils/data.py:304-318), the dump row of each
               local sample; micro-batch k takes micro_batch_indices[offset + k].
    popped     v0.3.1: the partition is popped before training (slime/utils/data.py:296): not derived, but the
               local samples' `sample_indices` (Sample.index) are kept, to match against the dump's samples.

`offset` is the iterator's at the step's start (slime's iterators are not reset between the steps of a rollout).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepStart:
    """The data iterator (slime's first, or the harness's) and its offset when the step's schedule began."""

    iterator: object
    offset: int


def rows(recipe: str, start: StepStart | None, microbatch: int | None, coords, args) -> tuple[list | None, str]:
    """(the dump rows of micro-batch `microbatch`'s samples, or None; how they were found or why not)."""
    if start is None or microbatch is None:
        return None, "not derived: the schedule's data iterator was not seen this step"
    local = _local_samples(start, microbatch)
    if local is None:
        return None, "not derived: the data iterator has neither micro_batch_indices nor micro_batch_size"
    data = getattr(start.iterator, "rollout_data", None) or {}
    if recipe == "partition":
        partition = data.get("partition")
        if partition is None:
            return None, "not derived: the rank's rollout data has no partition"
        return [int(partition[i]) for i in local], "the rank's partition (slime main)"
    if recipe == "popped":
        indices = data.get("sample_indices")
        how = "not derived: v0.3.1 pops the partition before training (slime/utils/data.py:296)"
        if indices is not None:
            how += f"; Sample.index of each sample: {[int(indices[i]) for i in local]}"
        return None, how
    if getattr(args, "balance_data", False):
        return None, "not derived: --balance-data partitions the samples by length (match Sample.index)"
    return [coords.dp_rank + coords.dp_size * i for i in local], (
        f"strided: DP rank {coords.dp_rank} of {coords.dp_size} holds rows {coords.dp_rank}, "
        f"{coords.dp_rank} + {coords.dp_size}, ..."
    )


def _local_samples(start: StepStart, microbatch: int) -> list[int] | None:
    """The rank's local sample indices in the step's micro-batch `microbatch`."""
    it = start.iterator
    indices = getattr(it, "micro_batch_indices", None)
    if indices is not None:
        return [int(i) for i in indices[start.offset + microbatch]]
    size = getattr(it, "micro_batch_size", None)
    if size is None:
        return None
    first = start.offset + microbatch * size
    return list(range(first, first + size))
