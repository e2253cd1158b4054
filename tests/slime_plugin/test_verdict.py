"""The rerun's verdict from every rank's sightings (`verdict.decide`), what it cannot rule out, and how the step
ends on each rank (`ending`): pure functions of the sightings, so every rank decides alike."""

import pytest

from nanscope.slime_plugin import ending, verdict
from nanscope.slime_plugin.nonfinite import Sighting
from nanscope.slime_plugin.settings import Settings

X = {"module": "decoder.layers.1.mlp", "direction": "forward", "microbatch": 0, "class": "model-forward"}
Y = {"module": "decoder.layers.3.mlp", "direction": "forward", "microbatch": 2, "class": "model-forward"}
ERROR = (
    "Rank 1, node n1, device 3, iteration -1: Unexpected result nan (message='found NaN in local grad norm for "
    "bucket #0 in backward pass before data-parallel communication collective')"
)
FINDING = "expert 5 of layer 3 received 0 tokens, and its weight gradient is the first non-finite one (w)"


def rank(r: int, summary=None, error=None, finding=None, order=None) -> Sighting:
    return Sighting(rank=r, pp=0, tp=0, node=f"n{r}", device=3, saw=summary is not None, summary=summary,
                    order=order, error=error, finding=finding)  # fmt: skip


FIRST = [rank(0), rank(1, X, ERROR, order=7)]


def test_a_rerun_that_is_finite_everywhere_is_transient_and_skippable():
    v = verdict.decide(FIRST, [rank(0), rank(1)], rank=1, started=0.0)
    assert (v.verdict, v.first, v.rerun, v.not_ruled_out, v.skippable) == ("not reproducible", X, None, (), True)
    assert v.producer == {"rank": 1, "pp": 0, "tp": 0, "node": "n1", "device": 3, **X}
    assert v.line() == (
        "nanscope: rerun: not reproducible (transient): the rerun of the step is finite; first producer: rank 1, "
        "node n1, device 3 (decoder.layers.1.mlp): check dmesg for XID and ECC errors, burn in that device, set "
        "TORCH_NCCL_NAN_CHECK=1 on the next run; a skip here is safe to repeat"
    )


def test_the_same_place_again_is_reproducible_and_a_healthy_rank_names_the_producer_not_none():
    v = verdict.decide(FIRST, FIRST, rank=0, started=0.0)
    assert v.verdict == "reproducible" and not v.skippable and v.first is None
    assert v.line() == (
        "nanscope: rerun: reproducible on this device: the rerun of the step is non-finite again at "
        "decoder.layers.1.mlp (forward, micro-batch 0, rank 1, class model-forward): the data or the numerics (or a "
        "device that fails every time)"
    )


def test_non_finite_again_elsewhere_is_nondeterminism_not_a_transient_device_fault():
    v = verdict.decide(FIRST, [rank(0), rank(1, Y)], rank=1, started=0.0)
    assert v.verdict == "not reproducible" and not v.skippable
    assert v.not_ruled_out == (
        "nondeterminism (a kernel whose result depends on run order, or memory read before it was written): the "
        "rerun is non-finite again at decoder.layers.3.mlp (forward, micro-batch 2, class model-forward), on rank 1",
    )
    line = v.line()
    assert line.startswith("nanscope: rerun: not reproducible, but not only a transient fault: the rerun of the step")
    assert line.endswith("look there before the hardware; NANSCOPE_SKIP_ON=transient does not skip this step")
    assert "None" not in line


def test_a_zero_token_expert_the_report_names_is_not_ruled_out_by_a_clean_rerun():
    first = [rank(0), rank(1, X, ERROR, finding=FINDING)]
    v = verdict.decide(first, [rank(0), rank(1)], rank=0, started=0.0)
    assert v.not_ruled_out == (f"a zero-token expert: {FINDING} (rank 1)",) and not v.skippable
    assert v.to_dict()["not_ruled_out"] == [f"a zero-token expert: {FINDING} (rank 1)"]


@pytest.mark.parametrize(
    "mode,skip_on,which,errors,expected",
    [
        ("raise", "any", "transient", True, ending.RAISE),
        ("raise", "any", "transient", False, ending.GO_ON),  # megatron's check off (or nothing reached a bucket)
        ("skip", "any", "reproducible", True, ending.SKIP),
        ("skip", "transient", "transient", True, ending.SKIP),
        ("skip", "transient", "reproducible", True, ending.RAISE),
        ("skip", "transient", "zero-token", True, ending.RAISE),
        ("skip", "any", None, True, ending.SKIP),
    ],
)
def test_every_rank_ends_the_step_alike(mode, skip_on, which, errors, expected):
    first = [rank(0), rank(1, X, ERROR if errors else None, finding=FINDING if which == "zero-token" else None)]
    again = {"transient": [rank(0), rank(1)], "zero-token": [rank(0), rank(1)], "reproducible": first}.get(which)
    v = None if which is None else verdict.decide(first, again, rank=0, started=0.0)
    settings = Settings(on_nonfinite=mode, skip_on=skip_on)
    assert ending.outcome(settings, v, first) == expected


def test_a_healthy_replica_raises_which_rank_saw_it_then_that_ranks_megatron_line():
    v = verdict.decide(FIRST, FIRST, rank=0, started=0.0)
    e = ending.error(0, {"rollout_id": 4, "step_id": 1}, FIRST, v, None)
    assert isinstance(e, ending.PeerNonFinite)
    assert str(e) == (
        "nanscope: rank 0 stops with its peers: rank(s) 1 saw non-finite values at rollout 4 step 1; rerun: "
        f"reproducible; this rank's own gradients were finite; rank 1's error follows\n{ERROR}"
    )
    own = verdict.decide(FIRST, FIRST, rank=1, started=0.0)  # what rank 1 decided: its own first value
    mine = ending.error(1, {"rollout_id": 4, "step_id": 1}, FIRST, own, "/r/rollout4_step1_rank1.json")
    assert type(mine) is RuntimeError
    assert str(mine).splitlines() == [
        "nanscope: rerun: reproducible on this device: the rerun of the step is non-finite again at decoder.layers.1.mlp "
        "(forward, micro-batch 0, class model-forward): the data or the numerics (or a device that fails every time) "
        "(report /r/rollout4_step1_rank1.json, its bundle beside it)",
        ERROR,
    ]
    without = ending.error(1, {"rollout_id": 4, "step_id": 1}, FIRST, None, None)
    assert str(without).splitlines() == [
        "nanscope: rank 1: non-finite values at rollout 4 step 1 (no report written: see the warning)", ERROR,
    ]  # fmt: skip
