"""The plugin inside real slime releases: each release's own loss_function, with its own policy loss and
then with `--loss-type custom_loss --custom-loss-function-path nanscope.slime_plugin.policy_loss`, on the
same batches, CP 1 and 2 (2 processes, gloo, megatron-core's parallel state).

Needs slime checkouts, one directory per tag, under NANSCOPE_SLIME_SRC (default: ../shared/slime-src beside the
repository, which CI has; tests/checkouts.py):

    git clone https://github.com/THUDM/slime && cd slime
    for t in v0.1.0 v0.2.4 v0.3.1; do git worktree add /tmp/slime/$t $t; done
    git worktree add /tmp/slime/main main
    NANSCOPE_SLIME_SRC=/tmp/slime pytest -m release

Healthy batches: loss, gradient and every metric of the release equal (relative difference <= 1e-6; 0
measured). Hazards: the plugin's loss, gradient and metrics are finite where the release's are not, and
on a masked-token hazard they equal the release's own on the defused twin. What each configuration
turns on is in worker.py (HEALTHY, HAZARDS).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkouts import RELEASES, slime_release

WORKER = Path(__file__).with_name("worker.py")
TOLERANCE = 1e-6

pytestmark = pytest.mark.integration


def _free_port() -> str:
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs in rendezvous
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="module", params=RELEASES)
def run(request, tmp_path_factory):
    """The worker's records for one release, both ranks: (release name, [records of rank 0, rank 1])."""
    checkout = slime_release(request.param)
    out = tmp_path_factory.mktemp(request.param)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        _free_port(),
        str(WORKER),
        "--slime-src",
        str(checkout),
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return request.param, ranks[0]["release"], [r["records"] for r in ranks]


def _plugin(records, healthy: bool):
    return [r for rank in records for r in rank if r["kind"] == "plugin" and (r["hazard"] is None) == healthy]


@pytest.mark.timeout(600)
def test_the_release_is_identified(run):
    tag, name, _ = run
    assert name.split(" ")[0] == tag


@pytest.mark.timeout(600)
def test_healthy_batches_give_the_release_own_loss_gradient_and_metrics(run):
    _, _, records = run
    healthy = _plugin(records, healthy=True)
    assert {r["cp"] for r in healthy} == {1, 2}
    for r in healthy:
        where = f"{r['config']} cp{r['cp']}"
        assert r["loss"] <= TOLERANCE and r["grad"] <= TOLERANCE, where
        assert r["metrics"] and all(v <= TOLERANCE for v in r["metrics"].values()), (where, r["metrics"])
        guards = {k: v for k, v in r["plugin_metrics"].items() if k.startswith("nan_guard/")}
        assert r["keys"] == list(r["release_metrics"]) + list(guards), where  # the release's keys, then the guards'
        assert set(guards.values()) == {0.0}, (where, guards)


@pytest.mark.timeout(600)
def test_the_healthy_configurations_exercise_their_feature(run):
    tag, _, records = run
    by_name = {r["config"]: r["release_metrics"] for r in _plugin(records, healthy=True) if r["cp"] == 1}
    assert by_name["defaults"]["pg_clipfrac"] > 0  # old != current policy: the clip binds somewhere
    assert by_name["tis"]["tis_clipfrac"] > 0
    if tag != "v0.1.0":
        assert by_name["opsm"]["opsm_clipfrac"] > 0
        assert by_name["icepop"]["tis_clipfrac"] != by_name["tis"]["tis_clipfrac"]
    if tag in ("v0.3.1", "main"):
        assert by_name["grouped-rollout-mask-sums"]["pg_loss"] != by_name["case-flags"]["pg_loss"]


@pytest.mark.timeout(600)
def test_hazards_are_finite_and_masked_ones_leave_the_step_as_without_them(run):
    _, _, records = run
    hazards = _plugin(records, healthy=False)
    assert {r["cp"] for r in hazards} == {1, 2}
    for r in hazards:
        assert r["plugin_finite"], f"{r['config']} cp{r['cp']}"
        if "vs_defused" in r:
            assert r["vs_defused"]["loss"] <= TOLERANCE and r["vs_defused"]["grad"] <= TOLERANCE, r["config"]
    # the batches are hazards for the release itself: its own loss is non-finite on some rank
    broken = {(r["config"], r["cp"]) for r in hazards if r["breaks_release"] and not r["release_finite"]}
    expected = {(r["config"], r["cp"]) for r in hazards if r["breaks_release"]}
    assert broken == expected


@pytest.mark.timeout(600)
def test_nanscope_safe_is_the_plugin_through_slime_v0_1_0(run):
    tag, _, records = run
    if tag != "v0.1.0":
        pytest.skip("nanscope's CPU model is of slime v0.1.0")
    model = [r for rank in records for r in rank if r["kind"] == "model"]
    assert len(model) >= 40
    for r in model:
        assert (r["loss"], r["grad"], max(r["metrics"].values())) == (0.0, 0.0, 0.0), f"{r['config']} cp{r['cp']}"
