"""A micro-batch's samples as rollout-dump rows, per release recipe, from slime's own data iterator."""

from types import SimpleNamespace

from nanscope.slime_plugin import rows
from nanscope.slime_plugin.coords import Coords

RANK_1_OF_2 = Coords(rank=1, dp_rank=1, dp_size=2)
ARGS = SimpleNamespace(balance_data=False)


class Iterator:  # slime's DataIterator's fields (v0.1.0 slime/backends/utils/data.py:11-22)
    def __init__(self, rollout_data=None, micro_batch_size=None, micro_batch_indices=None):
        self.rollout_data, self.micro_batch_size = rollout_data or {}, micro_batch_size
        self.micro_batch_indices, self.offset = micro_batch_indices, 0


def test_strided_static_micro_batches():
    # DP rank 1 of 2 holds dump rows 1, 3, 5, ...; micro-batches of 2; the step starts at local sample 4:
    # micro-batch 1 takes local samples 6, 7, i.e. rows 1 + 2*6 = 13 and 15
    start = rows.StepStart(Iterator(micro_batch_size=2), offset=4)
    found, how = rows.rows("strided", start, 1, RANK_1_OF_2, ARGS)
    assert found == [13, 15] and how.startswith("strided: DP rank 1 of 2 holds rows 1, 1 + 2")


def test_strided_dynamic_micro_batches():
    start = rows.StepStart(Iterator(micro_batch_indices=[[0, 2], [1], [3, 4, 5]]), offset=1)
    assert rows.rows("strided", start, 1, RANK_1_OF_2, ARGS)[0] == [1 + 2 * 3, 1 + 2 * 4, 1 + 2 * 5]


def test_main_keeps_the_partition():
    data = {"partition": [40, 7, 19, 3]}
    start = rows.StepStart(Iterator(data, micro_batch_indices=[[0, 1], [2, 3]]), offset=0)
    assert rows.rows("partition", start, 1, RANK_1_OF_2, ARGS) == ([19, 3], "the rank's partition (slime main)")


def test_what_cannot_be_derived_says_why():
    data = {"sample_indices": [1001, 1002]}
    start = rows.StepStart(Iterator(data, micro_batch_indices=[[1, 0]]), offset=0)
    found, how = rows.rows("popped", start, 0, RANK_1_OF_2, ARGS)
    assert found is None and how.endswith("Sample.index of each sample: [1002, 1001]")
    found, how = rows.rows("strided", start, 0, RANK_1_OF_2, SimpleNamespace(balance_data=True))
    assert found is None and "--balance-data" in how
    assert rows.rows("strided", None, 0, RANK_1_OF_2, ARGS)[0] is None
