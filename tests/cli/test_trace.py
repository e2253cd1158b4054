"""`nanscope trace` through argv."""

import inspect
import json

import pytest
import torch

from nanscope import case, hazards
from nanscope.cli.main import main
from nanscope.loss import formulas
from nanscope.trace.tracer import replay

pytestmark = pytest.mark.usefixtures("wide_lines")  # trace's lines asserted whole


def _exp_line(fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    (hit,) = [start + i for i, line in enumerate(lines) if ".exp()" in line]
    return hit


def test_trace_hazard_prints_both_producers_and_writes_json(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["trace", "--hazard", "kl-exp-overflow", "--json", str(out)]) == 0
    _, site = hazards.microbatch_document("kl-exp-overflow", flags=case.loss_flags())
    text = capsys.readouterr().out
    line = _exp_line(formulas.approx_kl)
    assert f"hazard site: sample {site[0]}, response token {site[1]}\n" in text
    assert "forward producer: aten.exp.default produced inf from inf-free inputs\n" in text
    assert "backward producer: aten.mul.Tensor produced NaN from NaN-free inputs\n" in text
    assert "  autograd node: ExpBackward0 (created in forward by exp)\n" in text
    assert (
        text.count(
            f"  source:  nanscope/loss/formulas.py:{line} in approx_kl `k3 = (-log_ratio).exp() - 1 + log_ratio`\n"
        )
        == 2
    )
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
    n = sum(hazards.microbatch_document("nan-reward", flags=case.loss_flags())[0]["batch"]["response_lengths"])
    assert f"  advantages: {n} nan; first at sample 0, response token 0, loss_mask 1\n" in text
    assert (
        "forward producer: none; no op turned finite values into non-finite ones: they came from an input (advantages)\n"
        in text
    )
    assert main(["trace", "--hazard", "kl-exp-overflow", "--loss", "safe"]) == 0
    text = capsys.readouterr().out
    assert "forward producer: none (every op output was finite)\n" in text
    assert "backward producer: none (every op output was finite)\n" in text
    assert "d loss / d logits has 0 non-finite entries" in text


def test_trace_allow_list(capsys):
    assert main(["trace", "--hazard", "kl-exp-overflow", "--allow", "aten.exp"]) == 0
    text = capsys.readouterr().out
    assert (
        "forward producer: none outside the allow-list; the first non-finite output is allow-listed: aten.exp.default produced inf"
        in text
    )
    # The backward NaN comes from ExpBackward0's mul, not from exp itself: still a producer.
    assert "backward producer: aten.mul.Tensor produced NaN from NaN-free inputs\n" in text


def test_trace_file(tmp_path, capsys):
    doc, site = hazards.microbatch_document(
        "ratio-exp-overflow", flags=case.loss_flags()
    )  # the PPO ratio's exp overflows
    path = tmp_path / "mb.pt"
    replay.save_microbatch(path, doc["batch"], doc["logits"], case.args(global_batch_size=8), "as-is")
    out = tmp_path / "t.json"
    assert main(["trace", str(path), "--json", str(out)]) == 0
    assert f"nanscope trace: {path} through the as-is loss" in capsys.readouterr().out
    fwd = json.loads(out.read_text())["trace"]["forward"]
    assert (fwd["op"], fwd["sample"], fwd["token"]) == ("aten.exp.default", site[0], site[1])
    assert fwd["source"].startswith(f"nanscope/loss/formulas.py:{_exp_line(formulas.ppo_clip_loss)} in ppo_clip_loss")
    # --loss overrides the file's loss: the fix's ratio never overflows (only the OIS metric's inline exp
    # does, left out of the metric), and no backward op makes a NaN.
    assert main(["trace", str(path), "--loss", "safe", "--json", str(out)]) == 0
    trace = json.loads(out.read_text())["trace"]
    assert " in policy_loss `ois = (-ppo_kl).exp()`" in trace["forward"]["source"] and trace["backward"] is None
    assert trace["outcome"]["grad_nonfinite"] == 0


def test_trace_bad_input_is_one_line_exit_2(tmp_path, capsys):
    torch.save({"batch": {}}, tmp_path / "x.pt")
    cases = [
        (["trace"], "give either FILE.pt or --hazard NAME (not both)"),
        (
            ["trace", "--hazard", "nope"],
            "--hazard nope: unknown hazard; known: healthy, kl-exp-overflow, "
            "ratio-exp-overflow, nan-rollout-logprob, nan-reward, zero-temperature, rollout-logprob-shift, "
            "activation-overflow, backward-only-fault, transient-fault, logprob-drift, moe-aux-loss, moe-zero-token-expert, "
            "moe-router-logits",
        ),
        (["trace", str(tmp_path / "none.pt")], f"{tmp_path / 'none.pt'}: micro-batch file: no such file"),
        (
            ["trace", str(tmp_path / "x.pt")],
            f"{tmp_path / 'x.pt'}: missing key 'logits' (expected batch, logits, args, loss)",
        ),
    ]
    doc, _ = hazards.microbatch_document("healthy", flags=case.loss_flags())
    replay.save_microbatch(
        tmp_path / "gspo.pt", doc["batch"], doc["logits"], {**doc["args"], "advantage_estimator": "gspo"}, "as-is"
    )
    cases.append(
        (
            ["trace", str(tmp_path / "gspo.pt")],
            f"{tmp_path / 'gspo.pt'}: the as-is loss rejected it: "
            "advantage_estimator 'gspo' (sequence-level ratio) is not modelled by nanscope",
        )
    )
    for argv, err in cases:
        assert main(argv) == 2
        assert capsys.readouterr().err == f"nanscope trace: error: {err}\n"


def test_trace_hostile_files_are_one_line_exit_2(tmp_path, capsys):
    doc, _ = hazards.microbatch_document("healthy", flags=case.loss_flags())
    batch = doc["batch"]
    files = {  # name -> (document or None for raw bytes, the error after "PATH: ")
        "empty.pt": (b"", "not a nanscope micro-batch file (not a torch.save zip archive)"),
        "text.pt": (b"hello", "not a nanscope micro-batch file (not a torch.save zip archive)"),
        "strlen.pt": (
            {**doc, "batch": {**batch, "total_lengths": ["34"] * 8}},
            "total_lengths of sample 0: expected an integer, got str '34'",
        ),
        "cp0.pt": (
            {**doc, "parallel": {"cp_rank": 0, "cp_size": 0}},
            "parallel: cp_rank 0, cp_size 0, tp_size 1: need sizes >= 1 and 0 <= cp_rank < cp_size",
        ),
        "argtype.pt": (
            {**doc, "args": {**doc["args"], "eps_clip": "0.2"}},
            "args: eps_clip '0.2': expected int or float",
        ),
        # slime divides the loss by global_batch_size: 0 gives inf, -4 flips the gradient's sign
        "gbs0.pt": (
            {**doc, "args": {**doc["args"], "global_batch_size": 0}},
            "args: global_batch_size 0: expected an integer >= 1",
        ),
        "gbs-4.pt": (
            {**doc, "args": {**doc["args"], "global_batch_size": -4}},
            "args: global_batch_size -4: expected an integer >= 1",
        ),
        "gbs2.5.pt": (
            {**doc, "args": {**doc["args"], "global_batch_size": 2.5}},
            "args: global_batch_size 2.5: expected an integer >= 1",
        ),
        "groups0.pt": (
            {**doc, "args": {**doc["args"], "n_samples_per_prompt": 0}},
            "args: n_samples_per_prompt 0: expected an integer >= 1",
        ),
        "nosamples.pt": ({**doc, "batch": {k: [] for k in batch}}, "batch: no samples (total_lengths is empty)"),
        "vocab0.pt": (
            {**doc, "logits": doc["logits"][..., :0]},
            f"logits: expected a float tensor [1, T, V], got shape (1, {doc['logits'].size(1)}, 0) torch.float32",
        ),
        "nested.pt": (
            {**doc, "batch": {**batch, "unconcat_tokens": [["a"]] * 8}},
            "unconcat_tokens of sample 0: expected a tensor or a list of numbers, got list",
        ),
        "meta.pt": (
            {**doc, "batch": {**batch, "log_probs": [torch.empty(3, device="meta")] * 8}},
            "log_probs of sample 0: a tensor on device meta (no data in the file), expected cpu",
        ),
        "huge.pt": (
            {**doc, "batch": {**batch, "total_lengths": [10**30] * 8}},
            f"unconcat_tokens of sample 0: {batch['total_lengths'][0]} tokens != total_length {10**30}",
        ),
        "sentinel.pt": (
            {"format": replay.SENTINEL_FORMAT, "rollout_id": 3, "step_id": 1, "input_ids": torch.zeros(1, 8)},
            "the sentinel's copy of a micro-batch's input_ids, no logits to replay: rerun the step as the "
            'report\'s "replay" says (NANSCOPE_TRACE_STEP=3:1)',
        ),
    }
    for name, (obj, err) in files.items():
        path = tmp_path / name
        path.write_bytes(obj) if isinstance(obj, bytes) else torch.save(obj, path)
        assert main(["trace", str(path)]) == 2, name
        got = capsys.readouterr().err
        assert got.startswith(f"nanscope trace: error: {path}: {err}") and got.count("\n") == 1, (name, got)
    (tmp_path / "dir.pt").mkdir()
    replay.save_microbatch(tmp_path / "ok.pt", batch, doc["logits"], doc["args"], "as-is")
    size = (tmp_path / "ok.pt").stat().st_size
    for argv, err in [
        ([str(tmp_path / "dir.pt")], f"{tmp_path / 'dir.pt'}: micro-batch file: is a directory, expected a file"),
        (["/dev/zero"], "/dev/zero: micro-batch file: not a regular file (a character device)"),
        (
            [str(tmp_path / "ok.pt"), "--max-input-mb", "0.01"],
            f"{tmp_path / 'ok.pt'}: micro-batch file: {size} bytes is over the 10485 bytes limit "
            "(raise it with --max-input-mb)",
        ),
        (
            [str(tmp_path / "ok.pt"), "--json", str(tmp_path / "no" / "t.json")],
            f"--json {tmp_path / 'no' / 't.json'}: no such directory: {tmp_path / 'no'}",
        ),
    ]:
        assert main(["trace", *argv]) == 2
        assert capsys.readouterr().err == f"nanscope trace: error: {err}\n"


def test_trace_never_imports_a_module_the_file_names(tmp_path, capsys, monkeypatch):
    """loss_type custom_loss made the replay import custom_loss_function_path's module and call it."""
    (tmp_path / "lib").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "lib" / "nanscope_test_payload.py").write_text(f"open({str(marker)!r}, 'w').close()\nrun = None\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    doc, _ = hazards.microbatch_document("healthy", flags=case.loss_flags())
    path = tmp_path / "custom.pt"
    args = {**doc["args"], "loss_type": "custom_loss", "custom_loss_function_path": "nanscope_test_payload.run"}
    torch.save({**doc, "args": args}, path)
    assert main(["trace", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"nanscope trace: error: {path}: args: loss_type 'custom_loss': a micro-batch replays slime's "
        "policy_loss (a custom_loss would import and run the module the file names)\n"
    )
    assert not marker.exists()


def test_a_model_fault_is_traced_by_repro_not_by_the_loss_replay(capsys):
    assert main(["trace", "--hazard", "activation-overflow"]) == 2
    assert capsys.readouterr().err == (
        "nanscope trace: error: --hazard activation-overflow: a fault in the model, not in the loss's batch: "
        "nanscope repro --hazard activation-overflow --trace\n"
    )


def test_trace_device_defaults_to_the_cpu_and_refuses_a_device_it_cannot_use(tmp_path, capsys):
    # --device cpu is the default's run, line for line; a device torch does not see, or meta, is one line, exit 2
    assert main(["trace", "--hazard", "kl-exp-overflow"]) == 0
    default = capsys.readouterr().out
    assert main(["trace", "--hazard", "kl-exp-overflow", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == default
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device, why in (
        ("meta", "--device meta: the replay runs on cpu or cuda"),
        ("bogus", "--device bogus: not a torch device (cpu, cuda, cuda:1, ...)"),
        (f"cuda:{cuda}", f"--device cuda:{cuda}: torch sees {cuda} CUDA device(s) here"),
    ):
        assert main(["trace", "--hazard", "kl-exp-overflow", "--device", device]) == 2
        assert capsys.readouterr().err == f"nanscope trace: error: {why}\n"
