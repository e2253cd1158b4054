"""`nanscope trace` on a verl bundle: replayed through the installed verl's ppo_loss, upstream / op / finite.

The bundles are written as nanscope.verl_plugin writes them (its Reporter's layout); needs verl, plain `pytest`
without it skips this module.
"""

import json

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402

from nanscope.cli.main import main  # noqa: E402
from nanscope.trace.bundles.verl_bundle import FORMAT  # noqa: E402

pytestmark = pytest.mark.usefixtures("wide_lines")  # trace's lines asserted whole


def _bundle(tmp_path, *, log_prob=None, old=None, mode="vanilla", loss_mode="nanscope"):
    g = torch.Generator().manual_seed(0)
    b, t = 3, 5
    lp = -torch.rand(b, t, generator=g) - 0.1 if log_prob is None else log_prob
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 3:] = False
    inputs = {
        "old_log_prob": lp + 0.1 * torch.randn(b, t, generator=g) if old is None else old,
        "log_prob": lp,
        "advantages": torch.randn(b, 1, generator=g).expand(b, t).clone(),
        "response_mask": mask,
    }
    config = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean",
              "policy_loss": {"loss_mode": loss_mode, "clip_cov_ratio": 0.2}}  # fmt: skip
    doc = {
        "format": FORMAT, "nanscope": "0", "verl": "0.9.0", "coords": {"rank": 1},
        "report": {"rank": 1, "rollout_id": 0, "step_id": 0, "class": "model-forward", "inner_loss_mode": mode},
        "config": config,
        "microbatches": [{"microbatch": 0, "inputs": inputs, "batch": {"dp_size": 1, "batch_num_tokens": 13,
                                                                      "global_batch_size": 3}, "loss": None}],
    }  # fmt: skip
    path = tmp_path / "rollout0_step0_rank1.bundle.pt"
    torch.save(doc, path)
    return path


def test_nonfinite_current_log_probs_are_upstream_of_the_loss(tmp_path, capsys):
    lp = -torch.rand(3, 5)
    lp[2, 1] = float("nan")
    assert main(["trace", str(_bundle(tmp_path, log_prob=lp))]) == 0
    out = capsys.readouterr().out
    assert "verl bundle, rank 1, update 0 mini-batch 0" in out
    assert "non-finite (1 of 15, the first at sample 2, response token 1): the NaN started upstream of the loss" in out


def test_a_masked_overflow_under_clip_cov_names_verls_exp(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=g) - 0.1
    old = lp + 0.01
    old[1, 4] = -100.0  # masked: log-ratio ~ 99 > 88.72
    path = _bundle(tmp_path, log_prob=lp, old=old, mode="clip_cov")
    json_out = tmp_path / "t.json"
    assert main(["trace", str(path), "--json", str(json_out)]) == 1
    out = capsys.readouterr().out
    assert "verl's ppo_loss (clip_cov) makes the first non-finite value: aten.exp" in out
    assert "core_algos.py" in out
    doc = json.loads(json_out.read_text())
    assert doc["verl_bundle"]["microbatches"][0]["finding"] == "op"


def test_healthy_inputs_replay_finite(tmp_path, capsys):
    assert main(["trace", str(_bundle(tmp_path))]) == 0
    assert "verl's ppo_loss (vanilla) is finite here, forward and backward" in capsys.readouterr().out


def test_a_malformed_verl_bundle_is_one_line(tmp_path, capsys):
    path = tmp_path / "x.bundle.pt"
    torch.save({"format": FORMAT, "report": {}, "microbatches": [{"inputs": {"log_prob": torch.zeros(3)}}]}, path)
    assert main(["trace", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "microbatches[0].inputs: expected [B, T] tensors of one shape" in err[0]
