"""`nanscope trace` through argv."""

import inspect
import json

import torch

from nanscope.cli.main import main
from nanscope.loss import formulas
from nanscope.slime_args import case_args
from nanscope.trace import replay


def _exp_line(fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    (hit,) = [start + i for i, line in enumerate(lines) if ".exp()" in line]
    return hit


def test_trace_hazard_prints_both_producers_and_writes_json(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["trace", "--hazard", "kl-exp-overflow", "--json", str(out)]) == 0
    _, site = replay.hazard_microbatch("kl-exp-overflow")
    text = capsys.readouterr().out
    line = _exp_line(formulas.approx_kl)
    assert f"hazard site: sample {site[0]}, response token {site[1]}\n" in text
    assert "forward producer: aten.exp.default produced inf from inf-free inputs\n" in text
    assert "backward producer: aten.mul.Tensor produced NaN from NaN-free inputs\n" in text
    assert "  autograd node: ExpBackward0 (created in forward by exp)\n" in text
    assert text.count(f"  source:  nanscope/loss/formulas.py:{line} in approx_kl `k3 = (-log_ratio).exp() - 1 + log_ratio`\n") == 2
    assert text.count(f"  token:   sample {site[0]}, response token {site[1]}, loss_mask 0 (masked)\n") == 2
    doc = json.loads(out.read_text())
    assert doc["hazard_site"] == list(site) and doc["loss"] == "as-is"
    fwd, bwd = doc["trace"]["forward"], doc["trace"]["backward"]
    assert (fwd["op"], fwd["sample"], fwd["token"], fwd["masked"]) == ("aten.exp.default", site[0], site[1], True)
    assert (bwd["op"], bwd["node"], bwd["token"]) == ("aten.mul.Tensor", "ExpBackward0", site[1])
    assert doc["trace"]["inputs"] == []


def test_trace_input_hazard_and_safe_loss(capsys):
    assert main(["trace", "--hazard", "nan-reward"]) == 0
    text = capsys.readouterr().out
    # The NaN reward spreads to the whole group of 8 = every sample: all response tokens are NaN.
    n = sum(replay.hazard_microbatch("nan-reward")[0]["batch"]["response_lengths"])
    assert f"  advantages: {n} nan; first at sample 0, response token 0, loss_mask 1\n" in text
    assert "forward producer: none; no op turned finite values into non-finite ones: they came from an input (advantages)\n" in text
    assert main(["trace", "--hazard", "ratio-exp-overflow", "--loss", "safe"]) == 0
    text = capsys.readouterr().out
    assert "forward producer: none (every op output was finite)\n" in text
    assert "backward producer: none (every op output was finite)\n" in text
    assert "d loss / d logits has 0 non-finite entries" in text


def test_trace_allow_list(capsys):
    assert main(["trace", "--hazard", "kl-exp-overflow", "--allow", "aten.exp"]) == 0
    text = capsys.readouterr().out
    assert "forward producer: none outside the allow-list; the first non-finite output is allow-listed: aten.exp.default produced inf" in text
    # The backward NaN comes from ExpBackward0's mul, not from exp itself: still a producer.
    assert "backward producer: aten.mul.Tensor produced NaN from NaN-free inputs\n" in text


def test_trace_file(tmp_path, capsys):
    doc, site = replay.hazard_microbatch("ratio-exp-overflow")
    path = tmp_path / "mb.pt"
    replay.save_microbatch(path, doc["batch"], doc["logits"], case_args(global_batch_size=8), "as-is")
    out = tmp_path / "t.json"
    assert main(["trace", str(path), "--json", str(out)]) == 0
    assert f"nanscope trace: {path} through the as-is loss" in capsys.readouterr().out
    fwd = json.loads(out.read_text())["trace"]["forward"]
    assert (fwd["op"], fwd["sample"], fwd["token"]) == ("aten.exp.default", site[0], site[1])
    assert fwd["source"].startswith(f"nanscope/loss/formulas.py:{_exp_line(formulas.ppo_clip_loss)} in ppo_clip_loss")
    # --loss overrides the file's loss.
    assert main(["trace", str(path), "--loss", "safe", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["trace"]["forward"] is None


def test_trace_bad_input_is_one_line_exit_2(tmp_path, capsys):
    torch.save({"batch": {}}, tmp_path / "x.pt")
    cases = [
        (["trace"], "nanscope trace: error: give either FILE.pt or --hazard NAME (not both)\n"),
        (["trace", "--hazard", "nope"], "nanscope trace: error: --hazard nope: unknown hazard; known: healthy, kl-exp-overflow, "
         "ratio-exp-overflow, nan-rollout-logprob, nan-reward\n"),
        (["trace", str(tmp_path / "none.pt")], f"nanscope trace: error: {tmp_path / 'none.pt'}: no such file\n"),
        (["trace", str(tmp_path / "x.pt")], f"nanscope trace: error: {tmp_path / 'x.pt'}: missing key 'logits' (expected batch, logits, args, loss)\n"),
    ]
    doc, _ = replay.hazard_microbatch("healthy")
    replay.save_microbatch(tmp_path / "gspo.pt", doc["batch"], doc["logits"], {**doc["args"], "advantage_estimator": "gspo"}, "as-is")
    cases.append((["trace", str(tmp_path / "gspo.pt")], f"nanscope trace: error: {tmp_path / 'gspo.pt'}: the as-is loss rejected it: "
                  "advantage_estimator 'gspo' (sequence-level ratio) is not modelled by nanscope\n"))
    for argv, err in cases:
        assert main(argv) == 2
        assert capsys.readouterr().err == err
