"""`nanscope doctor` through the CLI: the bundled case, the fixtures, JSON/HTML, and bad input."""

import json
import re
from pathlib import Path

import pytest

from nanscope.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def _flat(text: str) -> str:
    """Terminal output with box drawing removed and whitespace collapsed (rich wraps long lines)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")


@pytest.fixture(scope="module")
def case_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("doctor")
    return out / "d.json", out / "d.html"


def test_case_terminal_json_html(tmp_path, capsys):
    js, page = tmp_path / "d.json", tmp_path / "d.html"
    assert main(["doctor", "--case", "slime-795", "--json", str(js), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    flat = _flat(out)
    # The verdict is on the first screen, before the rank table.
    head = _flat("\n".join(out.splitlines()[:24]))
    assert "Rank 50 found NaN in its local gradient norm (bucket #0) before the data-parallel reduce" in head
    assert ("It is TP 2 / CP 0 / DP 0 / PP 3 (EP 2): the last pipeline stage, decoder layers 72-93 plus the final "
            "norm and output layer.") in head
    assert ("The flags enable 4 high-severity mechanism(s): kl-loss-exp-then-clamp (--use-kl-loss, --kl-loss-coef 0, "
            "--kl-loss-type low_var_kl); tis-unvalidated-rollout-logprobs (--use-tis, --custom-generate-function-path "
            "deepresearch.generate.generate, --tis-clip 2); custom-reward-grpo-normalisation (--custom-rm-path "
            "deepresearch.reward.reward_func, --advantage-estimator grpo, --n-samples-per-prompt 8); "
            "masked-tokens-reach-loss (--custom-generate-function-path deepresearch.generate.generate). "
            "3 more finding(s) below.") in head
    assert "node index 6 (= 50 // 8, nodes in slime's placement order: sorted by IP), local device 2" in flat
    assert "EP group 48-63" in flat
    assert "DP 2 (= 64/(4*4*2))" in flat
    assert "3 72-93 + final norm + output layer < 22" in flat
    assert "matches megatron-core 0.15.0rc0 rerun_state_machine.py:505" in flat
    assert "num-layers 94 from model.json (bundled with slime-795)" in flat

    doc = json.loads(js.read_text())
    assert doc["failing_rank"] | {"layers": None, "groups": None, "experts": None} == {
        "rank": 50, "tp": 2, "cp": 0, "dp": 0, "pp": 3, "ep": 2, "etp": 0, "expert_dp": 0, "node_index": 6,
        "local_device": 2, "layers": None, "holds_output_layer": True, "holds_embedding": False, "groups": None,
        "experts": None}
    assert doc["failing_rank"]["layers"] == list(range(72, 94))
    topo = doc["topology"]
    assert (topo["world"], topo["tp"], topo["pp"], topo["cp"], topo["dp"], topo["ep"], topo["etp"]) == (
        64, 4, 4, 2, 2, 16, 1)
    assert [s["layers"][0] for s in topo["stages"]] == [0, 24, 48, 72]
    assert (topo["optimizer_steps_per_rollout"], topo["micro_batch_token_budget"]) == (1, 32768)
    ids = [f["id"] for f in doc["findings"]]
    assert ids[:4] == ["kl-loss-exp-then-clamp", "tis-unvalidated-rollout-logprobs",
                       "custom-reward-grpo-normalisation", "masked-tokens-reach-loss"]
    assert set(doc["findings"][0]) == {"id", "severity", "title", "flags", "mechanism", "fix", "hazards"}
    assert doc["failure"]["iteration"] == -1 and doc["failure"]["kind"] == "NaN"
    assert doc["config"]["num_layers"] == {"value": 94, "origin": "model.json (bundled with slime-795)"}
    assert doc["config"]["tis_clip"] == {"value": 2.0, "origin": "default (slime v0.1.0)"}

    html = page.read_text()
    assert html.startswith("<!doctype html>") and "<script" not in html
    assert not re.search(r"(src|href)=", html)  # self-contained: nothing fetched
    assert html.count("stroke='#b00020'") == 1  # the failing rank only
    assert html.count("<rect") == 64 + 4  # one cell per rank + one layer bar per stage
    assert "<title>rank 50: TP 2 CP 0 DP 0 PP 3 EP 2</title>" in html
    assert "PP 3: 72-93 + output" in html


def test_colocated_qwen3_4b_rank_5(tmp_path, capsys):
    js = tmp_path / "q.json"
    assert main(["doctor", str(FIXTURES / "qwen3_4b_colocate.sh"), "--rank", "5", "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    r = doc["failing_rank"]
    # world 8, TP 2 -> DP 4; rank 5: tp 5 % 2 = 1, dp 5 // 2 = 2, pp 0 (the only, so last) stage
    assert (r["tp"], r["cp"], r["dp"], r["pp"], r["node_index"], r["local_device"]) == (1, 0, 2, 0, 0, 5)
    assert r["layers"] == list(range(36)) and r["holds_output_layer"] and r["holds_embedding"]
    assert doc["topology"]["dp"] == 4 and doc["topology"]["optimizer_steps_per_rollout"] == 1  # 32 x 8 / 256
    assert doc["failure"] is None
    ids = [f["id"] for f in doc["findings"]]
    assert ids == ["kl-loss-exp-then-clamp", "ppo-ratio-exp-then-clamp", "nan-check-kills-run"]
    assert "rollout GPUs (8) consistent with actor GPUs (8)" in doc["fine"]


def test_disaggregated_moe_rank_13(tmp_path, capsys):
    js = tmp_path / "m.json"
    argv = ["doctor", str(FIXTURES / "disaggregated_moe.sh"), "--env", "MASTER_ADDR=10.0.0.1", "--rank", "13",
            "--json", str(js)]
    assert main(argv) == 0
    doc = json.loads(js.read_text())
    t, r = doc["topology"], doc["failing_rank"]
    # world 16; DP 16/(2*2*1) = 4; expert DP 16/(1*8*2) = 1; 128/8 = 16 experts per EP rank
    assert (t["world"], t["dp"], t["expert_dp"], t["experts_per_ep_rank"], t["colocate"]) == (16, 4, 1, 16, False)
    # rank 13: tp 13 % 2 = 1, dp (13 // 2) % 4 = 2, pp 13 // 8 = 1, ep 13 % 8 = 5
    assert (r["tp"], r["dp"], r["pp"], r["ep"], r["node_index"], r["local_device"]) == (1, 2, 1, 5, 1, 5)
    assert r["layers"] == list(range(24, 48)) and r["experts"] == list(range(80, 96))
    assert r["groups"]["ep"] == list(range(8, 16))
    assert t["optimizer_steps_per_rollout"] == 2  # 16 x 4 / 32
    ids = {f["id"]: f for f in doc["findings"]}
    assert set(ids) == {"tis-unvalidated-rollout-logprobs", "custom-reward-grpo-normalisation",
                        "ppo-ratio-exp-then-clamp", "eps-clip-c-ignored", "sample-exceeds-microbatch-budget"}
    assert ids["tis-unvalidated-rollout-logprobs"]["severity"] == "medium"  # SGLang log-probs, no custom generate
    # budget 8192 x CP 1 < 2048 + 8192 = 10240
    assert ids["sample-exceeds-microbatch-budget"]["fix"].startswith("--max-tokens-per-gpu 10240")
    assert "disaggregated: 8 rollout GPUs + 16 actor GPUs" in doc["fine"]


def test_vpp_with_bare_traceback(tmp_path, capsys):
    js = tmp_path / "v.json"
    argv = ["doctor", str(FIXTURES / "vpp_dense.sh"), "--traceback", str(FIXTURES / "vpp_traceback.txt"),
            "--json", str(js)]
    assert main(argv) == 0
    doc = json.loads(js.read_text())
    r = doc["failing_rank"]
    # TP 1 CP 1, DP 2: rank 7 -> dp 7 % 2 = 1, pp 7 // 2 = 3; VPP 2 chunks 8v + 2r = {6, 7} and {14, 15}
    assert (r["rank"], r["dp"], r["pp"], r["layers"], r["holds_output_layer"]) == (7, 1, 3, [6, 7, 14, 15], True)
    assert doc["topology"]["vpp"] == 2
    assert [s["chunks"] for s in doc["topology"]["stages"]][0] == [[0, 1], [8, 9]]
    assert doc["failure"]["kind"] == "Inf" and doc["failure"]["bucket"] == 1
    assert [f["release"] for f in doc["frames"]][1] == "-"  # the unknown frame is kept
    out = _flat(capsys.readouterr().out)
    assert "decoder layers 6-7 | 14-15 (virtual stages) (0-based)" in out
    assert "line 19: $(cat ~/.wandb_key) is a run-time value, kept as text" in out


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err and len(err.splitlines()) == 1, err
    assert err.startswith("nanscope doctor: error: ")
    return err[len("nanscope doctor: error: "):]


def test_unreadable_script(tmp_path, capsys):
    msg = _error(["doctor", str(tmp_path / "missing.sh")], capsys)
    assert msg == f"{tmp_path / 'missing.sh'}: launch script: no such file"


def test_unreadable_traceback(tmp_path, capsys):
    msg = _error(["doctor", "--case", "slime-795", "--traceback", str(tmp_path / "tb.txt")], capsys)
    assert msg == f"{tmp_path / 'tb.txt'}: traceback: no such file"


def test_no_train_command(capsys):
    msg = _error(["doctor", str(FIXTURES / "no_train_command.sh")], capsys)
    assert msg.startswith(f"{FIXTURES / 'no_train_command.sh'}: no train command found")


def test_sizes_do_not_divide_world(capsys):
    msg = _error(["doctor", str(FIXTURES / "bad_divide.sh")], capsys)
    assert msg == ("tp(4)*pp(1)*cp(1) = 4 does not divide world(6) = actor-num-nodes(1) x "
                   "actor-num-gpus-per-node(6)")


def test_rank_outside_world(capsys):
    msg = _error(["doctor", "--case", "slime-795", "--rank", "64"], capsys)
    assert msg == "rank 64 is outside the world: 0..63 (= 8 nodes x 8 GPUs)"


def test_traceback_without_megatron_error(capsys):
    tb = FIXTURES / "no_megatron_error.txt"
    msg = _error(["doctor", "--case", "slime-795", "--traceback", str(tb)], capsys)
    assert msg.startswith(f"{tb}: no Megatron error found")


def test_case_script_without_total_nodes(capsys):
    from importlib.resources import files

    script = files("nanscope") / "cases" / "slime-795" / "launch.sh"
    msg = _error(["doctor", str(script)], capsys)
    assert msg == ("--actor-num-nodes: '$((NODES))' is not an integer (the script reads unset variables: "
                   "DISTRIBUTED_ARGS, MASTER_ADDR, MODEL_ARGS, SHARED_STORAGE_DATA, TOTAL_NODES, WANDB_API_KEY; "
                   "pass --env NAME=VALUE)")


def test_unknown_case_and_missing_inputs(capsys):
    assert _error(["doctor", "--case", "nope"], capsys) == "--case nope: unknown case (bundled: slime-795)"
    assert _error(["doctor"], capsys) == "give a launch script (or --case slime-795)"


def test_bad_model_json(tmp_path, capsys):
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    msg = _error(["doctor", "--case", "slime-795", "--model", str(bad)], capsys)
    assert msg.startswith(f"{bad}: not valid JSON: ")


def test_traceback_rank_outside_world(tmp_path, capsys):
    tb = tmp_path / "tb.txt"
    tb.write_text("RuntimeError: Rank 70, node n9, device 6, iteration -1: Unexpected result nan (message='x')\n")
    msg = _error(["doctor", "--case", "slime-795", "--traceback", str(tb)], capsys)
    assert msg == (f"{tb}: the failing rank 70 is outside this launch's world: 0..63 (= 8 nodes x 8 GPUs); "
                   "check --env and the script")


def test_one_range_formatter():
    from nanscope.report.text import span

    assert (span(list(range(72, 94))), span([6, 7, 14, 15]), span([]), span(None)) == (
        "72-93", "6, 7, 14, 15", "none", "unknown")
    assert (span([3, 4], min_run=3), span([48, 49, 50], min_run=3), span([], empty="-")) == ("3, 4", "48-50", "-")
