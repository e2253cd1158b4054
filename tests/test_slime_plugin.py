"""The plugin as slime v0.1.0 calls it: keyword arguments from slime's loss_function, slime's
field names and batch keys, under real megatron-core parallel state (TP 2 and CP 2, 2 processes)."""

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanscope import case, hazards
from nanscope.causes import catalogue
from nanscope.loss import safe
from nanscope.loss.microbatch import Parallel

WORKER = Path(__file__).parent / "workers" / "plugin_worker.py"


def reference(name):
    """Single-process safe loss on the full logits: what every layout must reproduce."""
    policy = hazards.synthetic_policy(512, 0)
    batch = hazards.build(name, policy, case.rollout(512, 0), 0)
    full = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    loss, _, log = safe.loss_function(case.args(global_batch_size=8), batch, 1, full, parallel=Parallel())
    (grad,) = torch.autograd.grad(loss, full)
    return loss.detach(), grad, log


def test_plugin_called_like_slime_single_process():
    from nanscope import slime_plugin
    from nanscope.loss import microbatch

    policy = hazards.synthetic_policy(512, 0)
    batch = hazards.build("kl-exp-overflow", policy, case.rollout(512, 0), 0)
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    ssm = microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False)
    loss, metrics = slime_plugin.policy_loss(
        args=case.args(global_batch_size=8), batch=batch, logits=logits, sum_of_sample_mean=ssm
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert metrics["nan_guard/exp_overflow"].item() == 1.0


def test_plugin_strict_policy_from_environment(monkeypatch):
    from nanscope import slime_plugin
    from nanscope.loss import microbatch

    monkeypatch.setenv("NANSCOPE_NAN_POLICY", "strict")
    policy = hazards.synthetic_policy(512, 0)
    batch = hazards.build("nan-rollout-logprob", policy, case.rollout(512, 0), 0)
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"])
    i, j = batch["hazard_site"]
    with pytest.raises(safe.NonFiniteInputError, match=f"rollout_log_probs is nan at sample {i}, response token {j}"):
        slime_plugin.policy_loss(
            args=case.args(global_batch_size=8),
            batch=batch,
            logits=logits,
            sum_of_sample_mean=microbatch.make_sum_of_sample_mean(batch, Parallel(), False, False),
        )


@pytest.mark.integration
@pytest.mark.timeout(240)
# both slow: the fast tier runs the plugin's loss at TP 2 x PP 2 in repro's default matrix (tests/cli/test_repro.py)
@pytest.mark.parametrize("layout", [pytest.param(f, marks=pytest.mark.slow) for f in ("--tp", "--cp")])
def test_plugin_under_megatron_parallel_state(tmp_path, layout):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:  # torchrun's --master-port 0 hangs in rendezvous: pick a free port
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        port,
        str(WORKER),
        layout,
        "2",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for h in (h for h in catalogue.CATALOGUE if h.level == "batch" and h.safe_finite):
        got = torch.load(tmp_path / f"{h.name}.pt", weights_only=True)
        loss, grad, log = reference(h.name)
        assert torch.isfinite(got["loss"]) and torch.isfinite(got["grad"]).all(), h.name
        # TP shards the vocabulary sums and CP splits the sample sums: fp32 reassociation, and the
        # loss is a cancelling sum of O(1) per-sample terms, so compare at 1e-6 of their scale; the
        # logits gradient is rounded to bf16 (megatron's fused backward), so allow one bf16 ulp (2^-7).
        assert got["loss"].item() == pytest.approx(loss.item(), abs=1e-6), h.name
        assert torch.allclose(got["grad"], grad, rtol=2**-7, atol=1e-5 * grad.abs().max().item()), h.name
        metrics = dict(zip(got["keys"], got["values"][1:].tolist()))
        assert all(math.isfinite(v) for v in metrics.values()), h.name


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_before_train_step_hook_raise_and_skip_on_the_cpu_harness(tmp_path):
    import json

    from nanscope.megatron import launcher
    from nanscope.megatron.spec import Layout, RunSpec

    specs = [
        # slime's own loss with only the hook added: the step dies as without nanscope, with a report
        RunSpec(hazard="kl-exp-overflow", loss="as-is", hook=True, on_nonfinite="raise"),
        # NANSCOPE_ON_NONFINITE=skip: step 2 of 3 is skipped on every rank, the run goes on
        RunSpec(hazard="kl-exp-overflow", loss="as-is", steps=3, inject_step=2, hook=True, on_nonfinite="skip"),
    ]
    res = launcher.launch(specs, Layout(), timeout_s=350, out_dir=tmp_path, loss_flags=case.loss_flags())
    raised, skipped = res.runs
    assert raised.observed == "nan-check"
    for r in raised.ranks:
        # the verdict of the step's rerun, then megatron's own words, which logs, Ray and doctor read as before
        assert r.error.startswith("nanscope: rerun: reproducible on this device: ") and len(r.reports) == 2
        assert r.error.endswith(case.nan_check_message()) and r.error.count("\n") == 1
        report = json.loads(open(r.reports[0]).read())
        assert (report["rank"], report["rollout_id"], report["step_id"], report["mode"]) == (r.rank, 0, 0, "raise")
        assert report["rerun"]["verdict"] == "reproducible" and report["rerun"]["first"] == report["rerun"]["rerun"]
        assert report["first_backward"] is not None  # the first module whose gradient went non-finite
        saved = torch.load(report["bundle"], weights_only=True)
        assert saved["format"] == "nanscope-bundle/1" and saved["coords"]["rank"] == r.rank
        if r.holds_output_layer:  # the NaN is born in the loss, behind the output layer (public names)
            assert report["first_forward"] is None and report["first_backward"]["module"] == "output_layer"
            # slime's own loss with the hook alone: the loss watch saw the finite inputs, so the class follows
            assert (report["class"], report["class_candidates"]) == ("loss-numerics", ["loss-numerics"])
            assert any(mb["batch"] is not None and mb["current"] is not None for mb in saved["microbatches"])
        else:  # the gradient arrived non-finite from the last stage
            assert report["class"] is None and "from the next pipeline stage" in report["class_evidence"][-1]
            (mb,) = saved["microbatches"]
            assert (mb["index"], mb["why"]) == (report["first_backward"]["microbatch"], ["sentinel-backward"])
    assert skipped.observed == "completed"
    for r in skipped.ranks:
        assert r.skipped_steps == 1 and r.params_finite is True
        norms = r.optimizer_grad_norm  # the skipped step reports a NaN grad norm, as slime treats an invalid step
        assert norms[1] != norms[1] and norms[0] > 0 and norms[2] > 0
