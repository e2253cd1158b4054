"""nanscope's own rank generator (launch.ranks) against megatron-core's `RankGenerator`, and a world of 2^20 ranks
described without being enumerated (issue 41 item 5, issue 42 item 6)."""

import itertools
import json
import subprocess
import sys
import time
import tracemalloc
import warnings

import pytest

from nanscope.launch.config import resolve
from nanscope.launch.ranks import Grid
from nanscope.launch.topology import build

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-dp-pp", "pp-dp-tp", "tp-pp-dp", "dp-tp-cp-pp-ep")


def _layouts():
    for order in ORDERS:
        names = order.split("-")
        for tp, cp, ep, dp, pp in itertools.product((1, 2, 3), (1, 2), (1, 4), (1, 2, 5), (1, 2, 3)):
            if (ep > 1 and cp > 1) or ("cp" not in names and cp > 1) or ("ep" not in names and ep > 1):
                continue  # megatron-core refuses both in one generator, or a size the order leaves out
            yield order, dict(tp=tp, cp=cp, ep=ep, dp=dp, pp=pp)


def test_every_coordinate_group_and_group_index_is_megatron_cores():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.parallel_state import RankGenerator
    checked = 0
    for order, sizes in _layouts():
        theirs = RankGenerator(order=order, rank_offset=0, **sizes)
        ours = Grid.of(order, **sizes)
        assert ours.world == theirs.world_size
        for kinds in ("tp", "cp", "ep", "dp", "pp", "dp-cp", "tp-pp"):
            if any(kind not in theirs.order.split("-") for kind in kinds.split("-")):
                continue
            for index, group in enumerate(theirs.get_ranks(kinds)):
                for position, rank in enumerate(group):
                    if "-" in kinds:
                        assert ours.members(rank, tuple(kinds.split("-"))) == group, (order, sizes, kinds, rank)
                        continue
                    assert (ours.coord(rank, kinds), list(ours.group(rank, kinds)), ours.group_index(rank, kinds)) == (
                        position,
                        group,
                        index,
                    ), (order, sizes, kinds, rank)
                    checked += 1
    assert checked > 20_000


@pytest.mark.parametrize(
    ("order", "sizes"),
    [("tp-tp", dict(tp=2)), ("tp-xx", dict(tp=2)), ("tp-dp", dict(tp=2, pp=2)), ("tp-dp", dict(tp=0))],
)
def test_a_generator_megatron_refuses_is_refused(order, sizes):
    with pytest.raises(ValueError):
        Grid.of(order, **sizes)


WORLD_2_20 = ["--actor-num-nodes", "131072", "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "8",
              "--pipeline-model-parallel-size", "4", "--expert-model-parallel-size", "16", "--num-layers", "8",
              "--rollout-batch-size", "1"]  # fmt: skip


def test_a_world_of_2_20_ranks_is_described_not_enumerated():
    """Before: megatron-core's generator listed every group of every kind (51 s and 1.5 GB for 2^20 ranks)."""
    tracemalloc.start()
    start = time.process_time()
    layout = build(resolve(WORLD_2_20))
    rank = layout.rank((1 << 20) - 3)
    seconds = time.process_time() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 10, seconds  # a hang check: a linear walk of the world took a minute
    assert peak < 16 << 20, peak  # nothing the size of the world is held
    assert (layout.world, layout.dp, rank.tp, rank.pp, rank.dp) == (1 << 20, 32768, 5, 3, 32767)
    assert rank.groups["dp"] == range(1048573 - 32767 * 8, 1048573 + 8, 8)
    assert rank.groups["dp_cp"] is None  # two digits over 4,096 ranks: not listed


def test_doctor_lays_out_the_case_at_2_20_ranks_in_seconds(tmp_path):
    """issue 42: `--case slime-795 --env TOTAL_NODES=131072` took 38 s and 1.2 GB; the JSON describes the groups."""
    out = tmp_path / "d.json"
    argv = ["doctor", "--case", "slime-795", "--env", "TOTAL_NODES=131072", "--json", str(out)]
    code = f"import sys; from nanscope.cli.main import main; sys.exit(main({argv!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["topology"]["world"] == 1 << 20 and doc["topology"]["ep_groups"] is None
    assert doc["topology"]["ep_group_count"] == 65536
    assert doc["failing_rank"]["groups"]["dp"] is None  # 32,768 ranks: described
    assert doc["failing_rank"]["groups_text"]["dp"] == "2, 10, ..., 262138 (32,768 ranks, every 8)"
