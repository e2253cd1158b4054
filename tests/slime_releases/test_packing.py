"""The plugin's loss adds no host read to a step under each release's own loss_function and metric packing.

Every release packs a micro-batch's metrics with `torch.tensor([n] + list(log.values()), device=logits.device)`,
which reads each metric to the host (on CUDA one sync each; cited file:line in packing_worker.py). With the hook
installed, the plugin's loss hands its nan_guard counters to the hook's record instead of the metrics: the release's
own loss and the plugin's make exactly the same reads. The loss alone keeps nan_guard/* among the metrics, one read
each (docs/costs.md). With --recompute-loss-function on and off where the release has it (v0.2.4 on), CP 1 and 2.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkouts import RELEASES, slime_release

WORKER = Path(__file__).with_name("packing_worker.py")

pytestmark = pytest.mark.integration


def _free_port() -> str:
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs in rendezvous
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="module", params=RELEASES)
def records(request, tmp_path_factory):
    """(release tag, both ranks' records) of one launch of packing_worker.py."""
    checkout = slime_release(request.param)
    out = tmp_path_factory.mktemp(f"packing-{request.param}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", _free_port(),
           str(WORKER), "--slime-src", str(checkout), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["release"] == request.param
    return request.param, [r for rank in ranks for r in rank["records"]]


@pytest.mark.timeout(600)
def test_with_the_hook_the_plugins_loss_reads_the_host_as_often_as_the_releases_own(records):
    tag, found = records
    configs = {r["config"] for r in found}
    assert ("recompute-loss-function" in configs) == (tag != "v0.1.0")
    for r in found:
        where = (r["config"], r["cp"])
        assert r["own"]["torch.tensor(data) element"] == len(r["own_keys"]), where  # the packing: one per metric
        assert r["hooked"] == r["own"], where  # the guard adds no read; its counters stay on the device
        assert r["hooked_keys"] == r["own_keys"] and r["hooked_equals_alone"], where
        assert len(r["records"]) == 1 and len(r["records"][0]) == 6, where  # the micro-batch's counters, once


@pytest.mark.timeout(600)
def test_the_loss_alone_reads_each_counter_once_and_the_record_holds_the_same_counts(records):
    _, found = records
    for r in found:
        where = (r["config"], r["cp"])
        guards = [k for k in r["alone_keys"] if k.startswith("nan_guard/")]
        assert r["alone_keys"] == r["own_keys"] + guards and len(guards) >= 4, where
        expected = dict(r["own"])
        expected["torch.tensor(data) element"] += len(guards)
        assert r["alone"] == expected, where
        alone = [v for v in r["alone_counters"] if v is not None]  # the keys this release reads, in METRICS order
        recorded = [v for v, a in zip(r["records"][0], r["alone_counters"]) if a is not None]
        assert recorded == alone, where
