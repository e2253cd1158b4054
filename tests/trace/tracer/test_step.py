"""A traced step of a real run: micro-batches matched to the rollout, token maps, the first op over ranks."""

from types import SimpleNamespace

import pytest
import torch

from nanscope.loss import layout
from nanscope.trace.tracer import step

# (total, response) of three samples; sample 1 has a masked response token 2.
SHAPES = [(10, 6), (12, 5), (9, 4)]
ORDER = [2, 0, 1]  # the micro-batch packs the rollout's samples 2, 0, 1


def _rollout():
    g = torch.Generator().manual_seed(0)
    out = [
        {"tokens": torch.randint(1, 500, (n,), generator=g), "response_length": r, "loss_mask": torch.ones(r)}
        for n, r in SHAPES
    ]
    out[1]["loss_mask"][2] = 0
    return out


def _packed(index):
    """slime's packed row for ORDER on this CP rank: local tokens, then padding; cu_seqlens in whole units."""
    row = torch.cat([index.local[i] for i in ORDER] + [torch.zeros(7, dtype=torch.long)]).unsqueeze(0)
    cu = [0]
    for i in ORDER:
        cu.append(cu[-1] + index.local[i].numel())
    cu.append(row.numel())
    return row, SimpleNamespace(cu_seqlens_q=torch.tensor(cu) * index.cp_size)


@pytest.mark.parametrize("cp_rank,cp_size", [(0, 1), (0, 2), (1, 2)])
@pytest.mark.parametrize("packed", [True, False])
def test_microbatch_map_names_rollout_samples_and_response_tokens(cp_rank, cp_size, packed):
    index = step.RolloutIndex(_rollout(), cp_rank, cp_size)
    row, params = _packed(index)
    tmap, ids = step.microbatch_map(index, row, params if packed else None)
    assert ids == ORDER
    # Loss level: [N] with the samples' local response tokens concatenated in packed order.
    expected = [(i, p) for i in ORDER for p in layout.response_positions(*SHAPES[i], cp_rank, cp_size)]
    sites = [tmap((len(expected),), k) for k in range(len(expected))]
    assert [(s.sample, s.token) for s in sites] == expected
    assert [s.masked for s in sites] == [i == 1 and p == 2 for i, p in expected]
    # Model level: [1, T, H] rows map to (sample, sequence position), padding to None.
    width = 3
    first_of_0 = index.local[2].numel()  # sample 0 starts after sample 2's local tokens
    start = layout.sequence_positions(SHAPES[0][0], cp_rank, cp_size)[0]
    assert tmap((1, row.numel(), width), first_of_0 * width + 1) == (0, start, "sequence", None)
    assert tmap((1, row.numel(), width), (row.numel() - 1) * width) is None


def test_unknown_sample_in_the_middle_gives_no_map():
    index = step.RolloutIndex(_rollout())
    row, params = _packed(index)
    row[0, index.local[2].numel() + 1] += 1  # sample 0's second token no longer matches the rollout
    assert step.microbatch_map(index, row, params) == (None, [2, 1])


def _ev(op, mb):
    return {"op": op, "microbatch": mb}


def test_first_across_ranks_forward_by_stage_backward_by_reverse_stage():
    records = [
        {"rank": 0, "pp": 0, "tp": 0, "trace": {"forward": _ev("f0", 1), "backward": _ev("b0", 1), "inputs": []}},
        {"rank": 2, "pp": 1, "tp": 0, "trace": {"forward": _ev("f2", 1), "backward": _ev("b2", 1), "inputs": []}},
        {
            "rank": 3,
            "pp": 1,
            "tp": 1,
            "trace": {"forward": _ev("f3", 0), "backward": None, "inputs": [{"name": "parameter w"}]},
        },
    ]
    first = step.first_across_ranks(records)
    assert first["forward"] == {"op": "f3", "microbatch": 0, "rank": 3, "pp": 1, "tp": 1}
    assert first["backward"] == {"op": "b2", "microbatch": 1, "rank": 2, "pp": 1, "tp": 0}
    assert first["inputs"] == [{"name": "parameter w", "rank": 3}]
    assert first["first_forward"] is first["first_backward"] is None  # no rank's trace has them
    clean = [{**r, "trace": {"forward": None, "backward": None, "inputs": []}} for r in records]
    phases = ("forward", "backward", "first_forward", "first_backward")
    assert step.first_across_ranks(clean) == dict.fromkeys(phases) | {"inputs": []}


def test_the_row_is_compared_on_the_host_whatever_its_device():
    # the user's input ids live on the run's device, the dump's tokens on the CPU: the row comes to the host once
    index = step.RolloutIndex(_rollout())
    row, params = _packed(index)
    copied = []

    class Elsewhere(torch.Tensor):  # a CPU tensor that records where it is asked to go
        def to(self, *args, **kwargs):
            copied.append(args)
            return torch.Tensor.to(self.as_subclass(torch.Tensor), *args, **kwargs)

    assert step.microbatch_map(index, row.as_subclass(Elsewhere), params)[1] == ORDER
    assert copied == [("cpu",)]


def test_input_ids_whose_values_cannot_reach_the_host_leave_the_forward_alone():
    # meta input ids (shapes, no data): the micro-batch is traced without token positions, one warning line
    chunk = torch.nn.Embedding(500, 4, device="meta")
    lines = []
    trace = step.StepTrace([chunk], _rollout(), warn=lines.append)
    trace._handles.append(chunk.register_forward_pre_hook(trace._mark(0), with_kwargs=True))  # the hook alone
    out = chunk(torch.zeros(1, 16, dtype=torch.long, device="meta"))
    assert out.is_meta and trace.calls == [1] and trace.microbatches == {}
    assert lines == ["trace: micro-batch 0 not matched to the rollout: NotImplementedError: Cannot copy out of meta "
                     "tensor; no data!"]  # fmt: skip
    for handle in trace._handles:
        handle.remove()
