"""Rank layout: megatron-core's RankGenerator coordinates, the layer split, and the consistency errors."""

import itertools
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from nanscope.errors import UserError
from nanscope.launch.config import resolve
from nanscope.launch.topology import build, split_layers

CASE = Path(__file__).resolve().parents[2] / "src" / "nanscope" / "cases" / "slime-795"

CASE_ARGV = [
    "--actor-num-nodes",
    "8",
    "--actor-num-gpus-per-node",
    "8",
    "--tensor-model-parallel-size",
    "4",
    "--pipeline-model-parallel-size",
    "4",
    "--context-parallel-size",
    "2",
    "--expert-model-parallel-size",
    "16",
    "--expert-tensor-parallel-size",
    "1",
    "--decoder-last-pipeline-num-layers",
    "22",
    "--rollout-batch-size",
    "64",
]


def _topo(argv, model=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(resolve(argv, model, "model.json"))


@pytest.fixture(scope="module")
def case_topo():
    return _topo(CASE_ARGV, json.loads((CASE / "model.json").read_text()))


def test_case_sizes(case_topo):
    t = case_topo
    # world 8x8 = 64; DP = 64/(4*4*2) = 2; expert DP = 64/(1*16*4) = 1; 128 experts / 16 = 8 per EP rank
    assert (t.world, t.tp, t.pp, t.cp, t.dp, t.ep, t.etp, t.edp) == (64, 4, 4, 2, 2, 16, 1, 1)
    assert t.order == "tp-cp-ep-dp-pp" and t.vpp is None and t.experts_per_rank == 8


def test_case_rank_50(case_topo):
    r = case_topo.rank(50)
    # tp = 50 % 4 = 2; cp = (50 // 4) % 2 = 0; dp = (50 // 8) % 2 = 0; pp = 50 // 16 = 3; ep = 50 % 16 = 2
    assert (r.tp, r.cp, r.dp, r.pp, r.ep, r.etp, r.edp) == (2, 0, 0, 3, 2, 0, 0)
    assert (r.node_index, r.local_device) == (6, 2)  # 50 // 8, 50 % 8
    assert r.layers == list(range(72, 94)) and r.holds_output_layer and not r.holds_embedding
    assert r.experts == list(range(16, 24))  # EP rank 2 x 8 experts
    groups = {key: list(group) for key, group in r.groups.items()}
    assert groups["ep"] == list(range(48, 64))
    assert groups["tp"] == [48, 49, 50, 51] and groups["pp"] == [2, 18, 34, 50]
    assert groups["dp"] == [50, 58] and groups["cp"] == [50, 54] and groups["dp_cp"] == [50, 54, 58, 62]


def test_case_every_rank_follows_tp_cp_ep_dp_pp(case_topo):
    for rank in range(64):
        c = case_topo.coord(rank)
        assert (c["tp"], c["cp"], c["dp"], c["pp"], c["ep"]) == (
            rank % 4,
            rank // 4 % 2,
            rank // 8 % 2,
            rank // 16,
            rank % 16,
        ), rank


def test_case_layer_split(case_topo):
    # (94 - 22) / 3 = 24 layers on stages 0-2, 22 on stage 3
    assert [(s.layers[0], s.layers[-1]) for s in case_topo.stages] == [(0, 23), (24, 47), (48, 71), (72, 93)]
    assert [s.output for s in case_topo.stages] == [False, False, False, True]
    assert [s.embedding for s in case_topo.stages] == [True, False, False, False]


def test_tp_pp_dp_mapping_changes_order():
    t = _topo(
        [
            "--actor-num-nodes",
            "2",
            "--actor-num-gpus-per-node",
            "8",
            "--tensor-model-parallel-size",
            "2",
            "--pipeline-model-parallel-size",
            "2",
            "--use-tp-pp-dp-mapping",
            "--num-layers",
            "4",
            "--rollout-batch-size",
            "1",
        ]
    )
    assert t.order == "tp-cp-ep-pp-dp" and t.dp == 4
    r = t.rank(5)
    assert (r.tp, r.pp, r.dp) == (1, 0, 1)  # tp = 5 % 2; pp = (5 // 2) % 2; dp = 5 // 4


def test_vpp_split_interleaves():
    # 16 layers, PP 4, 2 layers per virtual stage -> VPP 2, chunk (r, v) = 8v + 2r
    assert split_layers(16, 4, 2) == [[[0, 1], [8, 9]], [[2, 3], [10, 11]], [[4, 5], [12, 13]], [[6, 7], [14, 15]]]


def _megatron_split(num_layers, pp, vpp, first, last, emb, loss):
    """Megatron's own get_num_layers_to_build / get_transformer_layer_offset, parallel_state stubbed."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer import transformer_block, transformer_layer

    cfg = SimpleNamespace(
        pipeline_model_parallel_layout=None,
        num_layers=num_layers,
        num_layers_in_first_pipeline_stage=first,
        num_layers_in_last_pipeline_stage=last,
        account_for_embedding_in_pipeline_split=emb,
        account_for_loss_in_pipeline_split=loss,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
    )
    saved = {
        n: getattr(ps, n)
        for n in (
            "get_pipeline_model_parallel_rank",
            "get_pipeline_model_parallel_world_size",
            "get_virtual_pipeline_model_parallel_world_size",
        )
    }
    out = []
    try:
        ps.get_pipeline_model_parallel_world_size = lambda *a, **k: pp
        ps.get_virtual_pipeline_model_parallel_world_size = lambda *a, **k: vpp
        for r in range(pp):
            ps.get_pipeline_model_parallel_rank = lambda *a, r=r, **k: r
            chunks = []
            for v in range(vpp or 1):
                vp = v if vpp else None
                n = transformer_block.get_num_layers_to_build(cfg, vp_stage=vp)
                off = transformer_layer.get_transformer_layer_offset(cfg, vp_stage=vp)
                chunks.append(list(range(off, off + n)))
            out.append(chunks)
    finally:
        for n, f in saved.items():
            setattr(ps, n, f)
    return out


def test_split_matches_megatron_on_a_grid():
    cases = []
    for pp, vpp, first, last in itertools.product((2, 3, 4), (None, 2), (None, 2, 4), (None, 2, 6)):
        cases.append((24, pp, vpp, first, last, False, False))
    cases += [
        (15, 4, None, None, None, True, False),
        (14, 4, None, None, None, True, True),
        (15, 2, 2, None, None, True, False),
    ]
    checked = 0
    for num_layers, pp, vpp, first, last, emb, loss in cases:
        try:
            ours = split_layers(num_layers, pp, vpp, first, last, emb, loss)
        except UserError:
            continue
        assert ours == _megatron_split(num_layers, pp, vpp, first, last, emb, loss), (pp, vpp, first, last, emb)
        checked += 1
    assert checked >= 30  # most of the grid is a valid split


def test_world_not_divisible_is_a_user_error():
    with pytest.raises(
        UserError,
        match=r"tp\(4\)\*pp\(4\)\*cp\(2\) = 32 does not divide world\(48\) = "
        r"actor-num-nodes\(6\) x actor-num-gpus-per-node\(8\)",
    ):
        _topo([*CASE_ARGV, "--actor-num-nodes", "6"])


def test_expert_layout_not_divisible_is_a_user_error():
    with pytest.raises(UserError, match=r"etp\(1\)\*ep\(32\)\*pp\(4\) = 128 does not divide world\(64\)"):
        _topo([*CASE_ARGV, "--expert-model-parallel-size", "32"])


def test_experts_not_divisible_by_ep():
    with pytest.raises(UserError, match=r"num-experts\(100\) is not divisible by expert-model-parallel-size\(16\)"):
        _topo(CASE_ARGV, {"num_layers": 94, "num_experts": 100})


def test_uneven_split_not_divisible():
    # 94 - 21 = 73 layers over 3 middle stages
    with pytest.raises(UserError, match=r"num-layers\(94\) - first\(0\) - last\(21\) = 73 is not divisible by the 3"):
        _topo([*CASE_ARGV, "--decoder-last-pipeline-num-layers", "21"], {"num_layers": 94})


def test_rank_outside_world(case_topo):
    with pytest.raises(UserError, match=r"rank 64 is outside the world: 0\.\.63 \(= 8 nodes x 8 GPUs\)"):
        case_topo.rank(64)


def test_unknown_layers_leave_split_open():
    t = _topo(CASE_ARGV)
    assert t.stages is None and t.rank(50).layers is None
    assert any("num-layers unknown" in n for n in t.notes)
