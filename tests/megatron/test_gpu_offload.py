"""The case's CPU-offloaded optimizer (--optimizer-cpu-offload: megatron-core's HybridDeviceOptimizer), on a GPU.

It cannot run on CPU: it takes torch.cuda.current_stream() (cpu_offloading/hybrid_optimizer.py:217) and pins host
memory. So this check runs only where a GPU is lent (`pytest -m gpu`): a healthy step's synchronizing CUDA calls
from the plugin's code (torch.cuda.set_sync_debug_mode: at most the vote's one), and a non-finite step skipped
with the offloaded optimizer's parameters untouched (gpu_offload_worker.py). Until it has run, docs/layouts.md
lists this layout as untested.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("gpu_offload_worker.py")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.timeout(600)
def test_the_plugin_over_the_cpu_offloaded_optimizer(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=540)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["healthy"] == r["healthy"] and r["audited"] == r["audited"]  # both finite steps
    assert len(r["plugin_syncs"]) <= 1, r["plugin_syncs"]  # the vote's copy of its table to the host
    assert r["skipped"] == 1 and r["skipped_grad_norm"] != r["skipped_grad_norm"] and r["params_unchanged"]
    assert any(p.endswith(".bundle.pt") for p in r["reports"])
