"""Every catalogued hazard through the tracer: the producer op, its source line and its token."""

import argparse
import inspect

import pytest
import torch

from nanscope import case, hazards
from nanscope.errors import UserError
from nanscope.facts import numerics
from nanscope.loss import as_is, formulas
from nanscope.trace.tracer import replay
from tests.trace.tracer.conftest import HAZARDS


def _line_of(fn, needle: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    (hit,) = [start + i for i, line in enumerate(lines) if needle in line]
    return hit


def test_kl_exp_overflow_names_exp_forward_and_exp_backward_at_the_masked_token(hazard_trace):
    r, site = hazard_trace("kl-exp-overflow")
    line = _line_of(formulas.approx_kl, "(-log_ratio).exp()")
    f, b = r.forward, r.backward
    # Forward: exp(ref - logp) with ref - logp > 88.72 gives +inf, from finite inputs.
    assert (f.op, f.phase, f.produced, f.node) == ("aten.exp.default", "forward", "inf", None)
    assert f.source.startswith(f"nanscope/loss/formulas.py:{line} in approx_kl `k3 = (-log_ratio).exp()")
    assert f.nonfinite == {"nan": 0, "posinf": 1, "neginf": 0}
    assert (f.sample, f.token, f.axis, f.masked) == (site[0], site[1], "response", True)
    # Its input at that index is the overflowing exponent: above log(float32 max).
    assert float(f.input_summary[0].rsplit(": ", 1)[1]) > numerics.FP32_EXP_MAX
    # Backward: ExpBackward0 computes grad * result = 0 (the clamp's zero gradient) * inf = NaN.
    assert (b.op, b.phase, b.produced, b.node, b.created_by) == (
        "aten.mul.Tensor",
        "backward",
        "nan",
        "ExpBackward0",
        "exp",
    )
    assert b.source == f.source
    assert (b.sample, b.token, b.masked) == site + (True,)
    assert b.nonfinite == {"nan": 1, "posinf": 0, "neginf": 0}
    assert r.inputs == []
    # low_var_kl's clamp hides the inf in the forward; the gradient is NaN (hazards.run_loss: 512 entries).
    assert r.outcome["loss_finite"] is True and r.outcome["grad_nonfinite"] == 512


def test_ratio_exp_overflow_names_exp_in_ppo_clip_loss(hazard_trace):
    r, site = hazard_trace("ratio-exp-overflow")
    line = _line_of(formulas.ppo_clip_loss, "ratio = (-ppo_kl).exp()")
    assert (r.forward.op, r.forward.produced) == ("aten.exp.default", "inf")
    assert r.forward.source == f"nanscope/loss/formulas.py:{line} in ppo_clip_loss `ratio = (-ppo_kl).exp()`"
    assert (r.forward.sample, r.forward.token) == site
    assert (r.backward.op, r.backward.node, r.backward.produced) == ("aten.mul.Tensor", "ExpBackward0", "nan")
    assert r.backward.source == r.forward.source and (r.backward.sample, r.backward.token) == site


@pytest.mark.parametrize("name,key", [("nan-rollout-logprob", "rollout_log_probs"), ("nan-reward", "advantages")])
def test_input_hazards_have_no_producer_and_name_the_batch_key(hazard_trace, name, key):
    r, site = hazard_trace(name)
    assert r.forward is None and r.backward is None
    (finding,) = r.inputs
    assert finding.name == key
    assert finding.sample == site[0]
    if name == "nan-rollout-logprob":
        # One planted NaN at a masked tool-output token.
        assert (finding.token, finding.masked, finding.nonfinite["nan"]) == (site[1], True, 1)
        # The first non-finite op output is where the loss reads that input (microbatch.concat: the
        # bf16 -> fp32 copy of the sample's log-probs), a propagator.
        assert r.first_forward.source.startswith("nanscope/loss/microbatch.py:") and r.first_forward.produced == ""
    else:
        # GRPO spreads the NaN reward to its whole group of 8: every response token's advantage.
        doc, _ = hazards.microbatch_document(name, flags=case.loss_flags())
        assert finding.nonfinite["nan"] == sum(doc["batch"]["response_lengths"])
    assert r.outcome["loss_finite"] is False and r.outcome["grad_nonfinite"] > 0


@pytest.mark.parametrize("name", HAZARDS)
def test_safe_loss_has_no_event(hazard_trace, name):
    r, _ = hazard_trace(name, "safe")
    assert r.backward is None and r.first_backward is None
    assert r.outcome["loss_finite"] is True and r.outcome["grad_nonfinite"] == 0
    if name == "ratio-exp-overflow":
        # The fix runs slime's own policy loss; the OIS metric's exp is inline there (no helper to clamp):
        # it overflows at the hazard's token, which the metric and the loss then leave out.
        line = _line_of(as_is.policy_loss, "ois = (-ppo_kl).exp()")
        source = f"nanscope/loss/as_is.py:{line} in policy_loss `ois = (-ppo_kl).exp()`"
        assert (r.forward.op, r.forward.source) == ("aten.exp.default", source)
    else:
        assert r.forward is None
    if name in ("nan-rollout-logprob", "nan-reward"):
        assert r.first_forward is not None and r.inputs  # the input is still NaN; the loss neutralises it
    elif name != "ratio-exp-overflow":
        assert r.first_forward is None and r.inputs == []


def test_healthy_as_is_is_clean(hazard_trace):
    r, _ = hazard_trace("healthy")
    assert r.clean and r.ops_seen > 100


def _batch():
    # Two samples: totals 5 and 4, responses 3 and 2 -> N = 5 local response tokens, T = 9.
    return {
        "total_lengths": [5, 4],
        "response_lengths": [3, 2],
        "loss_masks": [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0])],
    }


def test_token_map_response_and_packed_axes():
    tmap = replay.token_map(_batch(), packed_length=12)
    # Loss level [N] and [N, V]: flat index -> response token.
    assert tmap((5,), 3) == (1, 0, "response", False)
    assert tmap((5, 7), 7 * 1 + 6) == (0, 1, "response", True)
    # Packed row [1, T, V] / [T, 1, H] / [T, V]: row 6 = sample 1 (starts at 5), sequence position 1.
    assert tmap((1, 12, 7), 7 * 6 + 3) == (1, 1, "sequence", None)
    assert tmap((12, 1, 4), 4 * 4) == (0, 4, "sequence", None)
    assert tmap((12, 7), 7 * 8) == (1, 3, "sequence", None)
    assert tmap((1, 12, 7), 7 * 10) is None  # padding after the last sample
    assert tmap((), 0) is None and tmap((3,), 0) is None


def test_token_map_under_context_parallelism():
    # layout.segments example: total 10, response 6, cp 2 (chunk 3): rank 1 holds sequence positions
    # 3-5 and 6-8, whose logits predict response tokens 0-5.
    batch = {"total_lengths": [10], "response_lengths": [6], "loss_masks": [torch.ones(6)]}
    tmap = replay.token_map(batch, cp_rank=1, cp_size=2)
    assert tmap((6,), 4) == (0, 4, "response", False)
    assert tmap((1, 6, 3), 3 * 3) == (0, 6, "sequence", None)


def test_saved_file_replays_like_the_hazard(tmp_path, hazard_trace):
    doc, site = hazards.microbatch_document("kl-exp-overflow", flags=case.loss_flags())
    path = tmp_path / "mb.pt"

    replay.save_microbatch(path, doc["batch"], doc["logits"], case.args(global_batch_size=8), "as-is")
    loaded = replay.load_microbatch(path)
    assert set(loaded) == {"format", "batch", "logits", "args", "loss"}
    r = replay.replay(loaded)
    expected, _ = hazard_trace("kl-exp-overflow")
    assert r.forward.to_dict() == expected.forward.to_dict()
    assert r.backward.to_dict() == expected.backward.to_dict()


def test_load_rejects_bad_files(tmp_path):
    doc, _ = hazards.microbatch_document("healthy", flags=case.loss_flags())
    cases = {
        "list.pt": ([1, 2], "expected a dict with keys batch, logits, args, loss; got list"),
        "noloss.pt": ({k: v for k, v in doc.items() if k != "loss"}, "missing key 'loss'"),
        "logits.pt": (
            {**doc, "logits": doc["logits"][0]},
            f"logits: expected a float tensor [1, T, V], got shape ({doc['logits'].size(1)}, 512) torch.float32",
        ),
        "mask.pt": (
            {**doc, "batch": {**doc["batch"], "loss_masks": [m[:-1] for m in doc["batch"]["loss_masks"]]}},
            "loss_masks of sample 0:",
        ),
        "args.pt": ({**doc, "args": {"bogus": 1}}, "args: not slime loss fields: ['bogus']"),
    }
    for name, (obj, msg) in cases.items():
        torch.save(obj, tmp_path / name)
        with pytest.raises(UserError) as e:
            replay.load_microbatch(tmp_path / name)
        assert msg in str(e.value), (name, str(e.value))
        assert str(e.value).startswith(str(tmp_path / name) + ": ")

    # An arbitrary pickled object: weights_only=True refuses to unpickle it.
    torch.save({"batch": argparse.Namespace(a=1)}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="not a nanscope micro-batch file"):
        replay.load_microbatch(tmp_path / "evil.pt")


def test_select_samples_keeps_the_event(hazard_trace):
    doc, site = hazards.microbatch_document("kl-exp-overflow", flags=case.loss_flags())
    small = replay.select_samples(doc, [site[0]])
    # Only that sample's rows of the packed logits: [1, total_i, V].
    assert small["logits"].shape == (1, doc["batch"]["total_lengths"][site[0]], doc["logits"].size(2))
    r = replay.replay(small)
    full, _ = hazard_trace("kl-exp-overflow")
    assert (r.forward.op, r.forward.sample, r.forward.token) == ("aten.exp.default", 0, site[1])
    assert (r.backward.node, r.backward.sample, r.backward.token) == ("ExpBackward0", 0, site[1])
    assert r.forward.input_summary[0].rsplit(": ", 1)[1] == full.forward.input_summary[0].rsplit(": ", 1)[1]
