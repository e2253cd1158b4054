"""The step's headroom row (`slime_plugin.headroom.measure`): the KL and TIS log-ratios are watched only where the
loss takes their exp (issue 31, item 8), and the row is built without a host sync or a boolean mask."""

import math

import pytest
import torch

from nanscope import case, hazards
from nanscope.loss import as_is, target
from nanscope.loss.microbatch import Parallel
from nanscope.slime_plugin import headroom
from nanscope.slime_plugin.loss_watch import LossWatch


def watched(args, name="healthy"):
    """One micro-batch through slime's loss under the loss watch: what the watch saw."""
    policy = hazards.synthetic_policy(512, 0)
    batch = hazards.build(name, policy, case.rollout(512, 0), 0)
    batch.pop("hazard_site")
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"])
    watch = LossWatch(target.model())
    try:
        as_is.loss_function(args, batch, 1, logits, parallel=Parallel())
    finally:
        watch.remove()
    return watch.seen


def row(args, name="healthy") -> dict:
    values = headroom.measure(watched(args, name), target.model(), torch.device("cpu")).tolist()
    return dict(zip(headroom.FIELDS, values))


@pytest.mark.parametrize(
    "flags,kl,tis",
    [
        ({"use_kl_loss": True, "kl_loss_type": "low_var_kl", "use_tis": True}, True, True),  # the case
        ({"use_kl_loss": True, "kl_loss_type": "k3", "use_tis": False}, True, False),
        ({"use_kl_loss": True, "kl_loss_type": "kl", "use_tis": True}, False, True),  # v0.1.0's k1: no exp
        ({"use_kl_loss": True, "kl_loss_type": "k2", "use_tis": False}, False, False),
        ({"use_kl_loss": False, "kl_loss_type": "low_var_kl", "use_tis": False}, False, False),
    ],
)
def test_kl_and_tis_are_measured_only_where_the_loss_takes_their_exp(flags, kl, tis):
    r = row(case.args(global_batch_size=8, **flags))
    assert math.isfinite(r["kl_value"]) == kl and math.isfinite(r["tis_value"]) == tis
    assert math.isfinite(r["ppo_value"])  # the PPO ratio's exp is always there
    if not kl:
        assert (r["kl_value"], r["kl_microbatch"], r["kl_sample"]) == (float("-inf"), -1.0, -1.0)


def test_get_mismatch_metrics_runs_the_tis_exp_from_v0_2_4():
    args = case.args(global_batch_size=8, use_tis=False)
    args.get_mismatch_metrics = True  # v0.2.4 on (loss.py:712); not one of v0.1.0's fields
    r = row(args)
    assert math.isfinite(r["tis_value"])


def test_the_gap_p99_is_the_largest_micro_batch_p99_and_nan_wins():
    args = case.args(global_batch_size=8)
    seen = watched(args)
    single = dict(zip(headroom.FIELDS, headroom.measure(seen, target.model(), torch.device("cpu")).tolist()))
    assert 0 <= single["gap_p99"] <= single["gap_value"]
    # a NaN rollout log-prob on a trained token (loss_mask 1) of another micro-batch: p99 and max are NaN
    bad = watched(args)[0]
    mask = bad.batch["loss_masks"][0]
    j = int(mask.nonzero()[0])
    rollout = [r.clone() for r in bad.batch["rollout_log_probs"]]
    rollout[0][j] = float("nan")
    bad.batch = {**bad.batch, "rollout_log_probs": rollout}
    both = dict(zip(headroom.FIELDS, headroom.measure(seen + [bad], target.model(), torch.device("cpu")).tolist()))
    assert math.isnan(both["gap_p99"]) and math.isnan(both["gap_value"])
    none = dict(zip(headroom.FIELDS, headroom.measure([], target.model(), torch.device("cpu")).tolist()))
    assert (none["gap_p99"], none["gap_count"], none["gap_sum"]) == (float("-inf"), 0.0, 0.0)
