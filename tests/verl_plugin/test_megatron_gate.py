"""On Megatron the vote sits at finalize_model_grads (the slime plugin's gate on finish_grad_sync): in bf16, where
megatron-core has no check and verl would apply the NaN update, the planted NaN never reaches the weights.

Real megatron-core 0.15 on CPU through nanscope's harness (megatron_gate_worker.py). verl's Megatron engine itself
needs Megatron-Bridge and Transformer Engine, so the worker stands in for the two engine methods the watch calls
(its chunks and optimizer_zero_grad, verl v0.9.0 megatron/transformer_impl.py:670-678). Slow; needs the verl
environment (the package installs into verl when imported).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.verl_plugin.megatron_gate_worker"  # run from ROOT: it imports tests/verl's fault
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(tmp_path, *argv):
    proc = subprocess.run([sys.executable, "-m", WORKER, *argv, str(tmp_path / "reports")], capture_output=True,
                          text=True, timeout=500, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def test_without_the_plugin_megatron_bf16_applies_the_nan(tmp_path):
    got, _ = _run(tmp_path, "none", "every")
    assert got["finite"] is False and got["unchanged"] is False


@pytest.mark.parametrize(("fault", "verdict"), [("every", "reproducible"), ("first", "not reproducible")])
def test_with_the_plugin_the_step_is_held_and_skipped_and_the_weights_are_untouched(tmp_path, fault, verdict):
    got, out = _run(tmp_path, "plugin", fault)
    assert got == {"error": None, "skipped": True, "finite": True, "unchanged": True, "module": got["module"]}
    report = json.loads((tmp_path / "reports" / "rollout0_step0_rank0.json").read_text())
    assert report["first_forward"]["module"] == "decoder.layers.0.mlp" and report["rerun"]["verdict"] == verdict
    assert "nanscope: actor update 0 mini-batch 0: {'skipped': True}" in out
