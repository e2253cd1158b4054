"""The layout matrix through slime v0.1.0's own train() and train_one_step (layout_worker.py), the hook over
slime's own loss: DP 2 with the distributed optimizer, --overlap-grad-reduce with megatron's check on and off,
full activation recompute, PP 2 with 2 virtual stages (get_model's stand-in builds one chunk per virtual stage);
raise, skip and skip-on-transient with the rerun on and off. The assertions are the harness matrix's
(tests/megatron/layout_checks.py): bounded, megatron's words on every raising rank, the report and the bundle,
skip on every rank, the next healthy rollout bitwise equal to a run that trained it alone.

Needs slime's v0.1.0 checkout under NANSCOPE_SLIME_SRC (skipped without it; test_releases.py says how).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.megatron.layout_checks import DP2_LAYOUTS, RAISE, SKIP, check_raise, check_report, check_skip

SRC = os.environ.get("NANSCOPE_SLIME_SRC")
WORKER = Path(__file__).with_name("layout_worker.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not SRC, reason="NANSCOPE_SLIME_SRC is not set (see tests/slime_releases/test_releases.py)"),
]


def _launch(tmp_path_factory, group: str) -> list[dict]:
    checkout = Path(SRC).resolve() / "v0.1.0"
    if not checkout.is_dir():
        pytest.skip(f"no slime v0.1.0 checkout at {checkout}")
    out = tmp_path_factory.mktemp(f"slime-{group}")
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs in rendezvous: pick a free port
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
           str(WORKER), "--slime-src", str(checkout), "--group", group, "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=540)
    stuck = sorted(p.read_text() for p in out.glob("stuck.rank*.txt"))
    assert proc.returncode == 0 and not stuck, (stuck, proc.stderr[-4000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    return _launch(tmp_path_factory, "dp2")


@pytest.fixture(scope="module")
def vpp(tmp_path_factory):
    return _launch(tmp_path_factory, "pp2-vpp2")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", DP2_LAYOUTS)
@pytest.mark.parametrize("mode", RAISE + SKIP)
def test_slime_train_one_step_at_dp2(dp2, layout, mode):
    check_report(dp2, layout, mode, fault_rank=1)
    if mode in RAISE:
        check_raise(dp2, layout, mode, fault_rank=1, checked=layout != "overlap-nocheck")
    else:
        check_skip(dp2, layout, mode)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", RAISE + SKIP)
def test_slime_train_one_step_with_two_virtual_stages(vpp, mode):
    check_report(vpp, "pp2-vpp2", mode, fault_rank=0)
    if mode in RAISE:
        check_raise(vpp, "pp2-vpp2", mode, fault_rank=0, checked=True)
    else:
        check_skip(vpp, "pp2-vpp2", mode)
