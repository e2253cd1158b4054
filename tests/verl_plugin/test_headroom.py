"""nanscope.verl_plugin.headroom: the vote's row from the loss mode's records, read by the slime plugin's vote.

The package installs into verl when imported: plain `pytest` without verl skips this module.
"""

import math

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402

from nanscope.loss import padded  # noqa: E402
from nanscope.slime_plugin import step_vote  # noqa: E402
from nanscope.slime_plugin.coords import Coords  # noqa: E402
from nanscope.slime_plugin.headroom import FIELDS  # noqa: E402
from nanscope.verl_plugin import headroom, inputs  # noqa: E402
from nanscope.verl_plugin.record import Call  # noqa: E402


def _call(microbatch, old, logp):
    return Call(microbatch=microbatch, headroom=padded.headroom(torch.tensor(old), torch.tensor(logp)))


def test_the_row_carries_the_largest_log_ratio_with_its_micro_batch_and_sample_into_the_vote():
    calls = [
        _call(0, [[-1.0, -1.0], [-1.0, -1.0]], [[-0.5, -1.0], [-1.0, -1.0]]),  # max 0.5 at sample 0
        _call(1, [[-1.0, -1.0], [-96.0, -1.0]], [[-1.0, -1.0], [-1.0, -1.0]]),  # max 95 at sample 1
    ]
    row = headroom.row(calls, torch.tensor(3.0), "cpu")
    assert row.shape == (len(FIELDS),)
    named = dict(zip(FIELDS, row.tolist()))
    assert (named["ppo_value"], named["ppo_microbatch"], named["ppo_sample"]) == (95.0, 1.0, 1.0)
    assert named["clamped"] == 1.0 and named["nonfinite_inputs"] == 3.0
    assert named["kl_value"] == -math.inf and named["gap_count"] == 0.0
    counts = torch.zeros(len(inputs.COUNTERS))
    vote = step_vote.exchange(False, Coords(), row, counters=step_vote.Counters(inputs.COUNTERS, counts, 1))
    assert vote.metrics["nanscope/max_ppo_log_ratio"] == 95.0
    assert vote.where["nanscope/max_ppo_log_ratio"] == {"rank": 0, "microbatch": 1, "sample": 1}
    assert vote.metrics["nanscope/max_kl_log_ratio"] is None
    assert vote.metrics["nanscope/nan_guard/old_log_probs"] == 0.0
    assert vote.metrics["nanscope/nonfinite_inputs"] == 3.0


def test_a_nan_log_ratio_is_the_maximum_and_no_record_is_none():
    calls = [_call(0, [[-1.0]], [[-0.5]]), _call(1, [[-1.0]], [[float("nan")]])]
    named = dict(zip(FIELDS, headroom.row(calls, torch.tensor(0.0), "cpu").tolist()))
    assert math.isnan(named["ppo_value"]) and named["ppo_microbatch"] == 1.0
    empty = dict(zip(FIELDS, headroom.row([Call(microbatch=0)], torch.tensor(0.0), "cpu").tolist()))
    assert empty["ppo_value"] == -math.inf and empty["ppo_sample"] == -1.0
