"""The layout matrix's assertions, shared by the harness's (tests/megatron/test_layouts.py) and slime's own
train_one_step's (tests/slime_releases/test_layouts.py): what each rank saw in each layout and mode."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

MEGATRON = re.compile(
    r"^Rank (\d+), node \S+, device cpu, iteration -1: Unexpected result nan \(message='found NaN in local grad norm "
    r"for bucket #\d+ in backward pass before data-parallel communication collective'\)$"
)
DP2_LAYOUTS = ("dp2", "overlap-check", "overlap-nocheck", "recompute")
RAISE, SKIP = ("raise", "raise-norerun"), ("skip", "skip-norerun", "skip-transient")


def megatron_rank(error: str) -> int:
    match = MEGATRON.match(error.splitlines()[-1])
    assert match, error
    return int(match[1])


def check_raise(ranks: list[dict], layout: str, mode: str, fault_rank: int, checked: bool) -> None:
    for r, rank in enumerate(ranks):
        if not checked:  # megatron's check is off: nothing raises, slime's own path drops the update
            step, healthy = rank[layout][mode]["steps"]
            assert "error" not in step and not step.get("ok") and step["grad_norm"] != step["grad_norm"], step
            assert "error" not in healthy and healthy["grad_norm"] == rank[layout]["reference"]["steps"][0]["grad_norm"]
            assert rank[layout][mode]["checksum"] == rank[layout]["reference"]["checksum"]  # the update was dropped
            continue
        (step,) = rank[layout][mode]["steps"]
        assert "error" in step, (layout, mode, r, step)
        lines = step["error"].splitlines()
        assert len(lines) == 2 and megatron_rank(step["error"]) in (r, fault_rank), step["error"]
        assert "None" not in lines[0], lines[0]
        if step["error_type"] == "PeerNonFinite":  # a healthy replica: which rank saw it, then that rank's words
            assert r != fault_rank and megatron_rank(step["error"]) == fault_rank
            assert lines[0].startswith(f"nanscope: rank {r} stops with its peers: rank(s) {fault_rank} saw ")
        else:
            assert megatron_rank(step["error"]) == r and "its bundle beside it)" in lines[0], step["error"]


def check_skip(ranks: list[dict], layout: str, mode: str) -> None:
    for rank in ranks:
        run, reference = rank[layout][mode], rank[layout]["reference"]
        assert [s.get("error") for s in run["steps"]] == [None, None], run["steps"]
        skipped, healthy = run["steps"]
        assert skipped["grad_norm"] != skipped["grad_norm"] and run["skipped"] == 1  # NaN: slime's invalid step
        assert healthy["grad_norm"] == reference["steps"][0]["grad_norm"]
        assert run["checksum"] == reference["checksum"] and run["params_finite"]  # bitwise
        assert run["lr_steps"] == reference["lr_steps"] > 0  # the skipped step did not advance the LR schedule


def report_of(run: dict) -> dict:
    (path,) = [p for p in run["reports"] if p.endswith(".json")]
    return json.loads(Path(path).read_text())


def check_report(ranks: list[dict], layout: str, mode: str, fault_rank: int) -> None:
    names = sorted(Path(p).name for p in ranks[fault_rank][layout][mode]["reports"])
    assert names == [f"rollout0_step0_rank{fault_rank}.bundle.pt", f"rollout0_step0_rank{fault_rank}.json"], names
    report = report_of(ranks[fault_rank][layout][mode])
    if mode.endswith("norerun"):
        assert "rerun" not in report
    else:
        expected = "not reproducible" if mode == "skip-transient" else "reproducible"
        assert report["rerun"]["verdict"] == expected and report["rerun"]["not_ruled_out"] == []


def launch(out: Path, worker: Path, *flags: str) -> list[dict]:
    """Both ranks' results of one torchrun launch of `worker` (2 processes), bounded: it returns, no watchdog fired."""
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs in rendezvous: pick a free port
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
           str(worker), *flags, "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=540)
    stuck = sorted(p.read_text() for p in out.glob("stuck.rank*.txt"))
    assert proc.returncode == 0 and not stuck, (stuck, proc.stderr[-4000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def check_dp2(ranks: list[dict], layout: str, mode: str) -> None:
    """A DP 2 layout's run: the NaN on rank 1."""
    check_report(ranks, layout, mode, fault_rank=1)
    if mode in RAISE:
        check_raise(ranks, layout, mode, fault_rank=1, checked=layout != "overlap-nocheck")
    else:
        check_skip(ranks, layout, mode)


def check_vpp(ranks: list[dict], mode: str) -> None:
    """The PP 2 x 2 virtual stages run: the NaN in rank 0's second chunk."""
    check_report(ranks, "pp2-vpp2", mode, fault_rank=0)
    if mode in RAISE:
        check_raise(ranks, "pp2-vpp2", mode, fault_rank=0, checked=True)
    else:
        check_skip(ranks, "pp2-vpp2", mode)
