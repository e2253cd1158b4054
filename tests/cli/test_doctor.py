"""`nanscope doctor` through the CLI: the bundled case, the fixtures, JSON/HTML, and bad input."""

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanscope import case
from nanscope.cli.main import main
from tests.address_space import after_imports

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def _flat(text: str) -> str:
    """Terminal output with box drawing removed and whitespace collapsed (rich wraps long lines)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


pytestmark = pytest.mark.usefixtures("wide_terminal")


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
    assert (
        "It is TP 2 / CP 0 / DP 0 / PP 3 (EP 2): the last pipeline stage, decoder layers 72-93 plus the final "
        "norm and output layer."
    ) in head
    assert (
        "The flags enable 4 high-severity mechanism(s): kl-loss-exp-then-clamp (--use-kl-loss, --kl-loss-coef 0, "
        "--kl-loss-type low_var_kl); tis-unvalidated-rollout-logprobs (--use-tis, --custom-generate-function-path "
        "deepresearch.generate.generate, --tis-clip 2); custom-reward-grpo-normalisation (--custom-rm-path "
        "deepresearch.reward.reward_func, --advantage-estimator grpo, --n-samples-per-prompt 8); "
        "masked-tokens-reach-loss (--custom-generate-function-path deepresearch.generate.generate). "
        "3 more finding(s) below."
    ) in head
    assert "node index 6 (= 50 // 8, nodes in slime's placement order: sorted by IP), local device 2" in flat
    assert "EP group 48-63" in flat
    assert "DP 2 (= 64/(4*4*2))" in flat
    assert "3 72-93 + final norm + output layer < 22" in flat
    assert "matches megatron-core 0.15.0rc0 rerun_state_machine.py:505" in flat
    assert "num-layers 94 from model.json (bundled with slime-795)" in flat

    doc = json.loads(js.read_text())
    assert doc["failing_rank"] | {"layers": None, "groups": None, "experts": None, "groups_text": None} == {
        "rank": 50,
        "tp": 2,
        "cp": 0,
        "dp": 0,
        "pp": 3,
        "ep": 2,
        "etp": 0,
        "expert_dp": 0,
        "node_index": 6,
        "local_device": 2,
        "layers": None,
        "holds_output_layer": True,
        "holds_embedding": False,
        "groups": None,
        "experts": None,
        "groups_text": None,
    }
    assert doc["failing_rank"]["layers"] == list(range(72, 94))
    assert doc["failing_rank"]["groups"]["dp_cp"] == [50, 54, 58, 62]
    assert doc["failing_rank"]["groups_text"]["ep"] == "48-63"
    assert doc["topology"]["ep_groups"] == [list(range(0, 16)), list(range(16, 32)), list(range(32, 48)),
                                            list(range(48, 64))]  # fmt: skip
    topo = doc["topology"]
    assert (topo["world"], topo["tp"], topo["pp"], topo["cp"], topo["dp"], topo["ep"], topo["etp"]) == (
        64,
        4,
        4,
        2,
        2,
        16,
        1,
    )
    assert [s["layers"][0] for s in topo["stages"]] == [0, 24, 48, 72]
    assert (topo["optimizer_steps_per_rollout"], topo["micro_batch_token_budget"]) == (1, 32768)
    ids = [f["id"] for f in doc["findings"]]
    assert ids[:4] == [
        "kl-loss-exp-then-clamp",
        "tis-unvalidated-rollout-logprobs",
        "custom-reward-grpo-normalisation",
        "masked-tokens-reach-loss",
    ]
    assert set(doc["findings"][0]) == {"id", "severity", "title", "flags", "mechanism", "fix", "hazards"}
    assert doc["failure"]["iteration"] == -1 and doc["failure"]["kind"] == "NaN"
    assert doc["config"]["num_layers"] == {"value": 94, "origin": "model.json (bundled with slime-795)"}
    assert doc["config"]["tis_clip"] == {"value": 2.0, "origin": "default (slime v0.1.0)"}
    assert doc["slime_release"] == {
        "version": "v0.1.0",
        "name": "v0.1.0",
        "how": "case",
        "source": "the bundled case ran slime v0.1.0; pass --slime-version to choose another",
    }
    assert out.splitlines()[1] == (
        "slime release v0.1.0 (case: the bundled case ran slime v0.1.0; pass --slime-version to choose another)"
    )

    html = page.read_text()
    assert html.startswith("<!doctype html>") and "<script" not in html
    assert not re.search(r"(src|href)=", html)  # self-contained: nothing fetched
    assert html.count("stroke='#b00020'") == 1  # the failing rank only
    assert html.count("<rect") == 64 + 4  # one cell per rank + one layer bar per stage
    assert "<title>rank 50: TP 2 CP 0 DP 0 PP 3 EP 2</title>" in html
    assert "PP 3: 72-93 + output" in html
    assert "<p class='muted'>slime release v0.1.0 (case: the bundled case ran slime v0.1.0; " in html


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
    assert (doc["slime_release"]["version"], doc["slime_release"]["how"], doc["slime_release"]["source"]) == (
        "v0.1.0",
        "assumed",
        "nothing in the script names a release; pass --slime-version to choose another",
    )


def test_disaggregated_moe_rank_13(tmp_path, capsys):
    js = tmp_path / "m.json"
    argv = [
        "doctor",
        str(FIXTURES / "disaggregated_moe.sh"),
        "--env",
        "MASTER_ADDR=10.0.0.1",
        "--rank",
        "13",
        "--json",
        str(js),
    ]
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
    assert set(ids) == {
        "tis-unvalidated-rollout-logprobs",
        "custom-reward-grpo-normalisation",
        "ppo-ratio-exp-then-clamp",
        "eps-clip-c-ignored",
        "sample-exceeds-microbatch-budget",
    }
    assert ids["tis-unvalidated-rollout-logprobs"]["severity"] == "medium"  # SGLang log-probs, no custom generate
    # budget 8192 x CP 1 < 2048 + 8192 = 10240
    assert ids["sample-exceeds-microbatch-budget"]["fix"].startswith("--max-tokens-per-gpu 10240")
    assert "disaggregated: 8 rollout GPUs + 16 actor GPUs" in doc["fine"]


def test_vpp_with_bare_traceback(tmp_path, capsys):
    js = tmp_path / "v.json"
    argv = [
        "doctor",
        str(FIXTURES / "vpp_dense.sh"),
        "--traceback",
        str(FIXTURES / "vpp_traceback.txt"),
        "--json",
        str(js),
    ]
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
    return err[len("nanscope doctor: error: ") :]


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
    assert msg == ("tp(4)*pp(1)*cp(1) = 4 does not divide world(6) = actor-num-nodes(1) x actor-num-gpus-per-node(6)")


def test_rank_outside_world(capsys):
    msg = _error(["doctor", "--case", "slime-795", "--rank", "64"], capsys)
    assert msg == "rank 64 is outside the world: 0..63 (= 8 nodes x 8 GPUs)"


def test_traceback_without_megatron_error(capsys):
    tb = FIXTURES / "no_megatron_error.txt"
    msg = _error(["doctor", "--case", "slime-795", "--traceback", str(tb)], capsys)
    assert msg.startswith(f"{tb}: no Megatron error found")


def test_case_script_without_total_nodes_infers_the_world_from_the_rank(tmp_path, capsys):
    """Issue 33: the case's own script without --env reads TOTAL_NODES unset; the traceback's rank 50 and the layout
    (TP4 PP4 CP2 = 32, ETP1 EP16 PP4 = 64, 8 GPUs per node: lcm 64) give world >= 64, 8 nodes: TOTAL_NODES=8 is
    inferred and marked, and the diagnosis is the case's."""
    from importlib.resources import files

    root = files("nanscope") / "cases" / "slime-795"
    inferred, case = tmp_path / "inferred.json", tmp_path / "case.json"
    argv = [str(root / "launch.sh"), "--traceback", str(root / "traceback.txt"), "--model", str(root / "model.json")]
    assert main(["doctor", *argv, "--json", str(inferred)]) == 0
    assert main(["doctor", *argv, "--env", "TOTAL_NODES=8", "--json", str(case)]) == 0
    out = _flat(capsys.readouterr().out)
    got, want = json.loads(inferred.read_text()), json.loads(case.read_text())
    for key in ("failing_rank", "findings", "candidates", "topology", "explanations", "failure"):
        assert got[key] == want[key], key
    assert got["config"]["actor_num_nodes"]["value"] == 8
    assert got["config"]["actor_num_nodes"]["origin"].startswith(
        "inferred: TOTAL_NODES=8 (8 nodes x 8 GPUs = world 64, the smallest world that holds rank 50: a multiple of "
        "TP4·PP4·CP2 = 32, of ETP1·EP16·PP4 = 64 and of 8 GPUs per node (lcm 64), so world >= 64: a lower bound"
    )
    assert got["inferred"] == [
        "--actor-num-nodes '$((NODES))' reads TOTAL_NODES, which the script never sets: inferred TOTAL_NODES=8 "
        "(8 nodes x 8 GPUs = world 64, the smallest world that holds rank 50: a multiple of TP4·PP4·CP2 = 32, of "
        "ETP1·EP16·PP4 = 64 and of 8 GPUs per node (lcm 64), so world >= 64: a lower bound, the rank's coordinates "
        "hold under it)"
    ]
    assert want["inferred"] == [] and want["config"]["actor_num_nodes"]["origin"] == "launch script"
    assert got["inputs"]["env"] == {"TOTAL_NODES": "8"}
    assert "inferred - --actor-num-nodes '$((NODES))' reads TOTAL_NODES" in out
    # the layout line marks the inferred world in the run without --env only
    assert out.count("layout world 64 (inferred: a lower bound, see below) = 8 nodes x 8 GPUs;") == 1
    assert out.count("layout world 64 = 8 nodes x 8 GPUs;") == 1
    # the script alone: no rank, the smallest world the layout allows is 64 all the same (EP16 x PP4)
    alone = tmp_path / "alone.json"
    assert main(["doctor", str(root / "launch.sh"), "--json", str(alone)]) == 0
    doc = json.loads(alone.read_text())
    assert (doc["topology"]["world"], doc["config"]["actor_num_nodes"]["value"], doc["failing_rank"]) == (64, 8, None)
    assert doc["missing"][0].startswith("no traceback: give it (--traceback FILE, or - for standard input)")


def test_the_case_s_launch_sh_at_v0_2_4_needs_no_env(tmp_path, capsys):
    # README's `nanscope doctor launch.sh --slime-version v0.2.4`, on the case's launch.sh as shipped, no --env
    js = tmp_path / "d.json"
    script = Path(case.root() / "launch.sh")
    assert main(["doctor", str(script), "--slime-version", "v0.2.4", "--json", str(js)]) == 0
    capsys.readouterr()
    doc = json.loads(js.read_text())
    assert doc["slime_release"]["version"] == "v0.2.4"
    # TOTAL_NODES inferred, and said so: the smallest world the layout allows (EP16 x PP4 = 64), 8 nodes of 8
    assert [line.split(" (")[0] for line in doc["inferred"]] == [
        "--actor-num-nodes '$((NODES))' reads TOTAL_NODES, which the script never sets: inferred TOTAL_NODES=8"
    ]
    assert (doc["topology"]["world"], doc["config"]["actor_num_nodes"]["value"]) == (64, 8)
    assert doc["config"]["kl_loss_type"]["value"] == "low_var_kl"


# `nanscope repro --launcher ray --hazard kl-exp-overflow --traceback-out tb.txt`, as it wrote it (rank 3 raised)
RAY_TRACEBACK = FIXTURES / "harness_ray_traceback.txt"


@pytest.mark.parametrize("script", [["--case", "harness"], [case.harness_script()]], ids=["case", "path"])
def test_the_harness_s_launch_sh_reads_a_repro_ray_traceback(script, tmp_path, capsys):
    js = tmp_path / "d.json"
    assert main(["doctor", *script, "--traceback", str(RAY_TRACEBACK), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    doc = json.loads(js.read_text())
    status = {c["id"]: c["status"] for c in doc["candidates"]}
    # the cause that fired: enabled by the harness's --use-kl-loss --kl-loss-coef 0 --kl-loss-type low_var_kl
    assert status["kl-exp-overflow"] == "enabled" and doc["inputs"]["env"] == {}
    assert doc["slime_release"]["how"] == "script" and doc["slime_release"]["version"] == "v0.1.0"
    rank = doc["failing_rank"]
    assert (rank["rank"], rank["tp"], rank["pp"], rank["layers"], rank["holds_output_layer"]) == (3, 1, 1, [2, 3], True)
    assert doc["topology"]["world"] == 4 and doc["inferred"] == [] and doc["contradictions"] == []
    assert "Rank 3 found NaN in its local gradient norm (bucket #0) before the data-parallel reduce" in _flat(out)


def test_unknown_case_and_missing_inputs(capsys):
    assert _error(["doctor", "--case", "nope"], capsys) == "--case nope: unknown case (bundled: slime-795, harness)"
    assert _error(["doctor"], capsys) == (
        "give a launch script, a --traceback FILE (- for standard input), or both (or --case slime-795)"
    )


def test_bad_model_json(tmp_path, capsys):
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    msg = _error(["doctor", "--case", "slime-795", "--model", str(bad)], capsys)
    assert msg.startswith(f"{bad}: model JSON: not valid JSON: ")


def test_traceback_rank_outside_world(tmp_path, capsys):
    tb = tmp_path / "tb.txt"
    tb.write_text("RuntimeError: Rank 70, node n9, device 6, iteration -1: Unexpected result nan (message='x')\n")
    msg = _error(["doctor", "--case", "slime-795", "--traceback", str(tb)], capsys)
    assert msg == (
        f"{tb}: the failing rank 70 is outside this launch's world: 0..63 (= 8 nodes x 8 GPUs); "
        "check --env and the script"
    )


def test_one_range_formatter():
    from nanscope.report.text import span

    assert (span(list(range(72, 94))), span([6, 7, 14, 15]), span([]), span(None)) == (
        "72-93",
        "6, 7, 14, 15",
        "none",
        "unknown",
    )
    assert (span([3, 4], min_run=3), span([48, 49, 50], min_run=3), span([], empty="-")) == ("3, 4", "48-50", "-")


# ---- hostile and careless input (issue 15) --------------------------------------------------------------
# Each case runs `python -m nanscope.cli.main doctor ...` in its own process under RLIMIT_AS (what doctor's imports
# map plus CASE_BUDGET, tests/address_space.py) and a wall-clock timeout: a FIFO that blocks the read, /dev/zero
# that fills memory, or a bash bomb that expands to 2^48 characters fails its case instead of passing. Two at a time
# (the machine has two cores).

DOCTOR_IMPORTS = "from nanscope.cli.main import build_parser\nbuild_parser()\n"  # doctor imports no torch, no megatron
CASE_BUDGET = 1280 << 20
CASE_SECONDS = 120  # a hang check (a FIFO, a bomb): an interpreter's start and doctor took 30 s at load 11
CASE_CPU_SECONDS = 20  # a work bound, not a speed: doctor's start and read take under 1 CPU s; a bomb took 57
TRAIN = "python3 train.py --colocate --rollout-batch-size 1 --num-layers 4 "


def _capped(limit: int):
    """preexec_fn: RLIMIT_AS `limit` and RLIMIT_CPU CASE_CPU_SECONDS in the child, before it runs python (a case
    past its CPU allowance dies of SIGXCPU, and its exit code fails the case: no wall-clock figure is asserted)."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CPU, (CASE_CPU_SECONDS, CASE_CPU_SECONDS))

    return cap


def _doctor_isolated(cases: list[list[str]], cwd: Path) -> list[tuple[int, str, float]]:
    """(exit code, stderr, seconds) of `nanscope doctor ARGV` for each case, each in its own limited process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    capped = _capped(after_imports(DOCTOR_IMPORTS) + CASE_BUDGET)

    def one(argv):
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "nanscope.cli.main", "doctor", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=CASE_SECONDS,
            preexec_fn=capped,
        )
        return proc.returncode, proc.stderr, time.monotonic() - start

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, cases))


def _matches(message: str, want: str) -> bool:
    """`want` with `<...>` standing for any text (a long value the message shortens)."""
    return re.fullmatch(".*".join(map(re.escape, want.split("<...>"))), message) is not None


def _refused(result: tuple[int, str, float]) -> str:
    """Exit 2 and exactly one `nanscope doctor: error: ` line, no traceback: the line's message."""
    rc, err, _ = result
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("nanscope doctor: error: "), (rc, err[-3000:])
    return lines[0][len("nanscope doctor: error: ") :]


@pytest.mark.slow  # 13 processes; the fast tier refuses hostile input in process (test_doctor_hostile.py)
def test_hostile_files_are_one_line_each(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/zero", tmp_path / "zero")
    with open(tmp_path / "big.sh", "w") as f:  # 4.5 MiB of comments, then a bad flag to stop at
        f.write(("#" * 1023 + "\n") * 4608 + TRAIN + "--rollout-num-gpus-per-engine 0\n")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "huge_int.json").write_text('{"num_layers": ' + "9" * 5000 + "}")
    (tmp_path / "tb.txt").write_text(
        f"Rank {'1' * 5000}, node a, device 1, iteration 1: Unexpected result nan (message='x')\n"
    )
    case = ["--case", "slime-795"]
    cases = {
        "fifo: launch script: not a regular file (a FIFO)": ["fifo"],
        "fifo: traceback: not a regular file (a FIFO)": [*case, "--traceback", "fifo"],
        "/dev/zero: launch script: not a regular file (a character device)": ["/dev/zero"],
        "zero: traceback: not a regular file (a character device)": [*case, "--traceback", "zero"],
        "zero: model JSON: not a regular file (a character device)": [*case, "--model", "zero"],
        "fifo: model-args file: not a regular file (a FIFO)": [*case, "--model-args", "fifo"],
        ".: launch script: is a directory, expected a file": ["."],
        "big.sh: launch script: 4.5 MiB is over the 4.0 MiB limit (raise it with --max-input-mb)": ["big.sh"],
        "--rollout-num-gpus-per-engine 0: must be >= 1": ["big.sh", "--max-input-mb", "5"],
        "deep.json: model JSON: not valid JSON: nested too deeply": [
            *case,
            "--model",
            "deep.json",
        ],
        "huge_int.json: model JSON: not valid JSON: Exceeds the limit (4300 digits) for integer string conversion": [
            *case,
            "--model",
            "huge_int.json",
        ],
        "tb.txt: line 1: the rank has 5000 digits, more than Megatron ever prints: not a Megatron error line": [
            *case,
            "--traceback",
            "tb.txt",
        ],
        "--json nowhere/d.json: no such directory: nowhere": [*case, "--json", "nowhere/d.json"],
    }
    results = _doctor_isolated(list(cases.values()), tmp_path)
    for want, result in zip(cases, results):
        assert _refused(result) == want


def test_nul_bytes_malformed_runs_and_whole_logs_take_seconds(tmp_path):
    """Issue 24: NUL bytes (tree-sitter was quadratic on them: 200 KB over 300 s), a long malformed run (its error
    recovery is quadratic: 256 KiB of `)a`, some 7 minutes), a job log over the input cap and Megatron-LM's loss
    message."""
    half = (2 << 20) - 512
    stop = (TRAIN + "--rollout-num-gpus-per-engine 0\n").encode()
    (tmp_path / "nul.sh").write_bytes(b"\0" * half + b"\nX=\0\n" + stop.replace(b"train", b"tr\0ain") + b"\0" * half)
    (tmp_path / "malformed.sh").write_bytes(b"X=1\n" + b")a" * (128 << 10) + b"\n" + stop)
    traceback = (
        (FIXTURES / "vpp_traceback.txt")
        .read_text()
        .replace(
            "found Inf in local grad norm for bucket #1 in backward pass before data-parallel communication collective",
            "found NaN in local forward loss calculation",
        )
    )
    with open(tmp_path / "job.log", "w") as log:  # 5 MiB of a job's output, then the error
        log.write("\x1b[36m(MegatronTrainRayActor pid=1, ip=10.0.0.1)\x1b[0m step: loss 0.01 grad_norm 1.5\n" * 70_000)
        log.write(traceback.replace("Rank 7,", "Rank \x1b[1m7\x1b[0m,"))
    cases = [
        ["nul.sh"],
        ["malformed.sh"],
        [str(FIXTURES / "vpp_dense.sh"), "--traceback", "job.log", "--json", "job.json"],
    ]
    nul, malformed, job = _doctor_isolated(cases, tmp_path)
    assert _refused(nul) == "--rollout-num-gpus-per-engine 0: must be >= 1"  # read to its end, NUL bytes dropped
    assert _matches(
        _refused(malformed),
        "malformed.sh: launch script: tree-sitter-bash gave up parsing it at line <...>, past its allowance (0.25 s of "
        "CPU + 1.5 s per MiB read; 256 MiB + 256 bytes per byte): its error recovery is quadratic on a long malformed "
        "run (`)a)a...`, `a|a|...|`, `x=(x=(...`); not a script nanscope can read",
    )
    assert job[:2] == (0, "nanscope doctor: wrote job.json (--json)\n"), job
    doc = json.loads((tmp_path / "job.json").read_text())
    assert (doc["failure"]["rank"], doc["failure"]["check"]) == (7, "forward-loss-nan")
    assert "The job was not slime's" in doc["verdict"]
    # each within CASE_CPU_SECONDS of CPU and CASE_SECONDS of wall: NUL bytes took hours


def _scripts(tmp_path: Path, texts: list[str]) -> list[list[str]]:
    """Write each text as a launch script; the doctor argv for each."""
    cases = []
    for i, text in enumerate(texts):
        (tmp_path / f"{i}.sh").write_text(text)
        cases.append([f"{i}.sh"])
    return cases


@pytest.mark.slow  # the fast tier keeps each bomb as text in tests/launch/test_script.py (rejects, caps, nesting)
def test_bash_bombs_and_bad_sizes_are_one_line_each(tmp_path):
    deep = 5000
    nodes = TRAIN + '--actor-num-nodes "$X"\n'
    cases = {
        # bash bombs: the value becomes its own text, with the reason, and the flag that needs it says so
        "X=$(seq 1 10000000000)\n"
        + nodes: "--actor-num-nodes: '$(seq 1 10000000000)' is not an integer (kept as text: `seq` gives "
        "10,000,000,000 numbers, more than 65,536)",
        "X=$((1<<99999999999))\n"
        + nodes: "--actor-num-nodes: '$((1<<99999999999))' is not an integer (kept as text: shift count 99999999999 is "
        "outside 0..63)",
        "X=$((7**99999999999))\n"
        + nodes: "--actor-num-nodes: '$((7**99999999999))' is not an integer (kept as text: overflows bash's signed "
        "64-bit arithmetic)",
        "X=ab\n"
        + 'X="$X$X"\n' * 48
        + nodes: '--actor-num-nodes: \'"$X$X""$X$X<...>...\' is not an integer (kept as text: longer than '
        "1,048,576 characters or 65,536 words)",
        "X=$(( 08 + 1 ))\n" + nodes: "--actor-num-nodes: '$(( 08 + 1 ))' is not an integer (kept as text: 08: "
        "value too great for base)",
        "X=$((65#1))\n" + nodes: "--actor-num-nodes: '$((65#1))' is not an integer (kept as text: 65#1: invalid "
        "arithmetic base)",
        "X="
        + "$(" * deep
        + "hostname"
        + ")" * deep
        + "\n"
        + nodes: "--actor-num-nodes: '$($($(<...>...' is not an integer",
        "X=$(("
        + "(" * deep
        + "1"
        + ")" * deep
        + "))\n"
        + nodes: "--actor-num-nodes: '$((((<...>...' is not an integer (kept as text: nested more than 100 deep)",
        "X="
        + "${A:-" * deep
        + "x"
        + "}" * deep
        + "\n"
        + nodes: "--actor-num-nodes: '${A:-${A:-<...>...' is not an integer (kept as text: nested more than 100 deep)",
        # sizes: Megatron's arithmetic, sane bounds
        TRAIN.replace(
            "--num-layers 4", "--num-layers 1000000000"
        ): "--num-layers 1000000000 (launch script): over 65,536, more than nanscope lays out",
        TRAIN
        + "--actor-num-nodes 100000000": "world(800000000) = actor-num-nodes(100000000) x actor-num-gpus-per-node(8) is over 1,048,576 ranks",
        TRAIN.replace("--num-layers 4", "--num-layers -4"): "--num-layers -4 (launch script): must be >= 1",
        TRAIN.replace("--num-layers 4", "--num-layers 0")
        + "--pipeline-model-parallel-size 2": "--num-layers 0 (launch script): must be >= 1",
        TRAIN + "--num-experts -8": "--num-experts -8 (launch script): must be >= 1",
        TRAIN.replace("--num-layers 4", "--num-layers 94")
        + "--pipeline-model-parallel-size 4": "num-layers(94) % pp(4) = 2 != 0: Megatron splits the layers evenly over the pipeline stages "
        "(uneven: --decoder-first/last-pipeline-num-layers)",
        TRAIN
        + "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 0": "--decoder-first-pipeline-num-layers 0: must be in 1..num-layers(4)",
        TRAIN
        + "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 0": "--num-virtual-stages-per-pipeline-rank 0: must be >= 1",
        TRAIN + "--tensor-model-parallel-size 0": "--tensor-model-parallel-size 0: must be >= 1",
        TRAIN + "--actor-num-nodes " + "9" * 30: "--actor-num-nodes: " + "9" * 30 + " is not a 64-bit integer",
        TRAIN + "--lr 1e-6 --eps-clip inf": "--eps-clip: 'inf' is not a finite number",
        TRAIN + "--kl-loss-coef nan": "--kl-loss-coef: 'nan' is not a finite number",
    }
    results = _doctor_isolated(_scripts(tmp_path, list(cases)), tmp_path)
    for (text, want), result in zip(cases.items(), results):
        assert _matches(_refused(result), want), (text[:200], result)


def test_an_unset_variable_in_a_size_is_unknown_not_refused(tmp_path, capsys):
    """Issue 33: an unset variable that was meant to hold a flag's value (careless) no longer refuses the run: the
    value is unknown, the default assumed and said so, in the JSON origin and the terminal's inferred lines."""
    script = tmp_path / "train.sh"
    script.write_text(TRAIN + "--tensor-model-parallel-size $EXTRA_ARGS 2\n")
    out = tmp_path / "out.json"
    assert main(["doctor", str(script), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["tensor_model_parallel_size"] == {
        "value": 1,
        "origin": "unknown: the script gives '$EXTRA_ARGS 2', which reads variables it never sets; the default assumed",
    }
    line = (
        "--tensor-model-parallel-size '$EXTRA_ARGS 2' reads variables the script never sets: unknown, the default 1 "
        "assumed (pass --env NAME=VALUE)"
    )
    assert doc["inferred"] == [line]
    assert line in _flat(capsys.readouterr().out)


def _bomb(d) -> str:
    """Lines that leave a drawn hostile value in X: deep nesting, a huge seq or shift, doubling, any number."""
    kind = d.draw(st.sampled_from(["nest", "seq", "arith", "double", "array", "number"]))
    if kind == "nest":
        left, right = d.draw(st.sampled_from([("$(", ")"), ("$((", "))"), ("${A:-", "}"), ('"$(', ')"')]))
        depth = d.draw(st.integers(1, 3000))
        return f'X="{left * depth}1{right * depth}"\n'
    if kind == "seq":
        return f'X="$(seq {d.draw(st.integers(-(10**20), 10**20))} {d.draw(st.integers(-(10**20), 10**20))})"\n'
    if kind == "arith":
        op = d.draw(st.sampled_from(["<<", ">>", "**", "*", "/", "%", "+"]))
        return f'X="$(( {d.draw(st.integers(-(10**25), 10**25))} {op} {d.draw(st.integers(-(10**12), 10**12))} ))"\n'
    if kind == "double":
        return "X=ab\n" + 'X="$X$X"\n' * d.draw(st.integers(0, 64))
    if kind == "array":
        return "X=(a b)\n" + 'X=("${X[@]}" "${X[@]}")\n' * d.draw(st.integers(0, 40)) + 'X="${X[*]}"\n'
    # not starting or ending with "#": after "$(( " or before " ))" tree-sitter-bash reads a comment (`$(( 0# ))`
    # -> "no train command found"; bash: "invalid number"), and the script is a syntax error; "@" only
    # as a digit after "#" (64#@ is 62): elsewhere tree-sitter-bash fails the whole script (bash only the
    # expansion), e.g. `$(( Z8_z@z ))` -> "no train command found"
    number = d.draw(
        st.text("0123456789abcxyzXZ@_#", min_size=1, max_size=40).filter(
            lambda t: "#" not in (t[0], t[-1]) and all(i > 0 and t[i - 1] == "#" for i, c in enumerate(t) if c == "@")
        )
    )
    return f'X="$(( {number} ))"\n'


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(d=st.data())
def test_generated_bash_bombs_are_one_line_each(d):
    """Eight scripts per example, each with a drawn bomb feeding a flag, then a flag slime rejects."""
    texts = [_bomb(d) + TRAIN + '--actor-num-nodes "$X" --rollout-num-gpus-per-engine 0\n' for _ in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        results = _doctor_isolated(_scripts(Path(tmp), texts), Path(tmp))
    for text, result in zip(texts, results):
        message = _refused(result)
        assert message.startswith(("--actor-num-nodes", "--rollout-num-gpus-per-engine 0: must be >= 1", "world(")), (
            text[:300],
            message,
        )


def _size(good: list[int]) -> st.SearchStrategy[int]:
    """Mostly a size that lays out, sometimes one that must be refused."""
    bad = [0, -3, 3, 16, 10**9, 2**63 - 1, -(2**63)]
    return st.integers(0, 11).flatmap(lambda i: st.sampled_from(bad if i == 0 else good))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    world=st.tuples(_size([1, 2, 4, 8]), _size([1, 2, 4, 8])),
    parallel=st.tuples(*[_size([1, 1, 2])] * 4),
    model=st.tuples(*[_size([4, 8, 16, 32])] * 2),
    first=st.one_of(st.none(), _size([1, 2, 4])),
    vpp=st.one_of(st.none(), _size([1, 2])),
)
def test_any_sizes_give_a_layout_or_one_line(tmp_path_factory, capsys, world, parallel, model, first, vpp):
    """Drawn parallel and model sizes: a report (exit 0), or exit 2 with one `error:` line; never a crash."""
    names = (
        "actor-num-nodes",
        "actor-num-gpus-per-node",
        "tensor-model-parallel-size",
        "pipeline-model-parallel-size",
        "context-parallel-size",
        "expert-model-parallel-size",
        "num-layers",
        "num-experts",
        "decoder-first-pipeline-num-layers",
        "num-virtual-stages-per-pipeline-rank",
    )
    values = (*world, *parallel, *model, first, vpp)
    argv = " ".join(f"--{name} {v}" for name, v in zip(names, values) if v is not None)
    script = tmp_path_factory.mktemp("sizes") / "s.sh"
    script.write_text("python3 train.py --colocate --rollout-batch-size 1 " + argv + "\n")
    start = time.process_time()
    rc = main(["doctor", str(script), "--rank", "0"])
    err = capsys.readouterr().err
    assert time.process_time() - start < 20, argv  # CPU s, a work bound (a bomb took 57), not a speed
    if rc == 2:
        assert len(err.splitlines()) == 1 and err.startswith("nanscope doctor: error: "), (argv, err)
    else:
        assert (rc, err) == (0, ""), argv


def test_doctor_never_imports_megatron_core_or_torch(tmp_path):
    """Issue 41 item 5: the layout is nanscope's own arithmetic (launch.ranks), so doctor runs, script and log, with
    megatron and torch refused at import."""
    block = (
        "import importlib.abc, sys\n"
        "class Refuse(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('megatron', 'torch'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r} (blocked by the test)')\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "from nanscope.cli.main import main\n"
        f"sys.exit(main(['doctor', '--case', 'slime-795', '--html', {str(tmp_path / 'd.html')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (0, f"nanscope doctor: wrote {tmp_path / 'd.html'} (--html)\n")
    assert "TP 2 / CP 0 / DP 0 / PP 3" in " ".join(proc.stdout.split())


# 5 prompts x 8 samples = 40 per rollout, global batch 32; the KL term at coefficient 0 with no --kl-loss-type;
# dual-clip asked for. What changes with the release: the KL default, the 8-sample remainder, --eps-clip-c.
RELEASE_SCRIPT = (
    "python3 train.py --actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate --num-layers 4 "
    "--rollout-batch-size 5 --n-samples-per-prompt 8 --global-batch-size 32 --use-kl-loss --kl-loss-coef 0 "
    "--eps-clip-c 3\n"
)


@pytest.mark.parametrize(
    ("spelling", "key", "kl", "remainder", "dual_clip"),
    [
        ("0.1.0", "v0.1.0", "kl", "critical", False),
        ("v0.2.4", "v0.2.4", "k1", "low", False),
        ("V0.3.1", "v0.3.1", "k1", "low", False),
        ("main", "main", "k1", "low", True),
    ],
)
def test_slime_version_applies_that_release(tmp_path, capsys, spelling, key, kl, remainder, dual_clip):
    script, js = tmp_path / "run.sh", tmp_path / "d.json"
    script.write_text(RELEASE_SCRIPT)
    assert main(["doctor", str(script), "--slime-version", spelling, "--json", str(js)]) == 0
    name = "main (2026-08-21, 624b824)" if key == "main" else key
    assert capsys.readouterr().out.splitlines()[1] == f"slime release {name} (option: --slime-version {spelling})"
    doc = json.loads(js.read_text())
    assert doc["slime_release"] == {
        "version": key,
        "name": name,
        "how": "option",
        "source": f"--slime-version {spelling}",
    }
    assert doc["config"]["kl_loss_type"] == {"value": kl, "origin": f"default (slime {key})"}
    assert (
        f"--kl-loss-type {kl} has no exp: no KL overflow (slime {key}'s default: the KL term's exp hazard needs "
        "--kl-loss-type low_var_kl or k3)"
    ) in doc["fine"]
    found = {f["id"]: f for f in doc["findings"]}
    assert found["rollout-not-multiple-of-global-batch"]["severity"] == remainder
    assert ("eps-clip-c-ignored" in found) != dual_clip
    assert ("rollout_max_response_len" in doc["config"]) and doc["config"]["rollout_max_response_len"]["value"] == (
        1024 if key == "v0.1.0" else None
    )


def test_the_release_is_read_from_the_script(tmp_path, capsys):
    script, js = tmp_path / "run.sh", tmp_path / "d.json"
    script.write_text(
        "# docker run slimerl/slime:v0.3.1\n" + RELEASE_SCRIPT.replace("--eps-clip-c 3", "--get-mismatch-metrics")
    )
    assert main(["doctor", str(script), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert doc["slime_release"]["source"] == f"{script} line 1 names it: slime:v0.3.1"
    assert doc["findings"][0]["id"] == "tis-unvalidated-rollout-logprobs"  # --get-mismatch-metrics runs TIS


def test_an_unknown_release_is_refused_in_one_line(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(RELEASE_SCRIPT)
    assert main(["doctor", str(script), "--slime-version", "0.2.2"]) == 2
    assert capsys.readouterr().err == (
        "nanscope doctor: error: unknown slime release '0.2.2' (known: v0.1.0, v0.2.4, v0.3.1, main)\n"
    )
    script.write_text("# slimerl/slime:v0.3.0\n" + RELEASE_SCRIPT)
    assert main(["doctor", str(script)]) == 2
    assert capsys.readouterr().err == (
        f"nanscope doctor: error: {script}: line 1 names slime 0.3.0 (slime:v0.3.0), a release nanscope does not "
        "know (known: v0.1.0, v0.2.4, v0.3.1, main); pass --slime-version to use the defaults of one\n"
    )


def test_a_value_at_exactly_the_reading_cap_leaves_its_command_read(tmp_path, capsys):
    """19 doublings of "ab" make X 1,048,576 characters, the cap itself: the command's words together pass it. The
    command is still read, with that word kept as text (a hypothesis draw once found "no train command found")."""
    script = tmp_path / "bomb.sh"
    script.write_text("X=ab\n" + 'X="$X$X"\n' * 19 + TRAIN + '--actor-num-nodes "$X" --rollout-num-gpus-per-engine 0\n')
    assert main(["doctor", str(script)]) == 2
    assert capsys.readouterr().err == (
        "nanscope doctor: error: --actor-num-nodes: '\"$X\"' is not an integer (kept as text: longer than 1,048,576 "
        "characters or 65,536 words)\n"
    )
