"""No harm on a healthy step, measured on CPU (audit_worker.py; the instrument: audit.py), one process through real
megatron-core: the same healthy step of slime v0.1.0's train_one_step with the plugin's hook and without it.

    host syncs    what would block the host on a GPU, at dispatch and at the Python level: the hook adds exactly
                  one, the vote's (its all-gathered table and this rank's sentinel flags, read in one copy)
    memory        the hook's largest new tensor is at most 1/64 of the step's logits (one micro-batch's [S, V]), at
                  the harness's vocabulary (512) and 8 micro-batches: the sentinel's fold of its slots, 1 byte a
                  module-output check, at most 1 KiB (trace/sentinels/slots.py)

Before: 76 syncs (headroom's torch.tensor(list, device=) and boolean masks, the sentinel's own read, a
`torch.isfinite(g).all()` per chunk output) and a temporary the size of the logits (that isfinite's abs).
The plugin's loss (--loss-type custom_loss) made one more per micro-batch, its guard's branch on a finite batch
(loss/guard.py `_Inputs`); it now selects instead and adds none.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("audit_worker.py")
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def audit(tmp_path, *flags) -> dict:
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--report-dir", str(tmp_path / "reports"), *flags],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.timeout(360)
def test_the_hook_adds_one_host_sync_and_no_temporary_near_the_logits(tmp_path):
    a = audit(tmp_path, "--samples", "8")
    without, with_hook = a["run_syncs"]
    assert without == with_hook > 0  # megatron's and slime's loss's own, untouched
    assert {k: v for k, v in a["with"].items() if k.startswith("plugin: ")} == {"plugin: tolist": 1}  # the vote
    size, op = a["plugin_largest"]
    assert 64 * size <= a["logits_bytes"], (size, op, a["logits_bytes"])


@pytest.mark.timeout(360)
def test_the_plugins_loss_adds_no_host_sync(tmp_path):
    a = audit(tmp_path, "--plugin-loss", "--samples", "4")
    assert a["plugin_syncs"] == 1 and {k: v for k, v in a["with"].items() if k.startswith("plugin: ")} == {
        "plugin: tolist": 1
    }  # the vote's, the only one
    assert 64 * a["plugin_largest"][0] <= a["logits_bytes"]
