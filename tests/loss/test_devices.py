"""The loss on any device: both losses run with every tensor on `meta`, and the guard's work does not grow with the
micro-batch's samples.

The meta device holds shapes and no data: an op that reads a value to the host (`.item()`, `bool(t)`, `.tolist()`,
nonzero, boolean-mask indexing, a copy to the CPU) raises there, and an op that mixes a CPU tensor with a meta one
raises ("Tensor on device meta is not on the expected device cpu!"): on CUDA the first is a host sync and the
second an error. A host-to-device copy the host would wait for (`.to(device)` without non_blocking) does not raise
on meta, so `NoHostWait` fails on it, and on any data-dependent op that would still dispatch.
"""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nanscope import case, hazards
from nanscope.loss import as_is, devices, microbatch, safe
from nanscope.loss.microbatch import Parallel

READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::equal", "aten::is_nonzero"}


class NoHostWait(TorchDispatchMode):
    """Fails on an op a CUDA host would wait for: a data read, or a blocking copy between host and device."""

    def __init__(self):
        super().__init__()
        self.device_ops: collections.Counter = collections.Counter()  # op -> calls with an output on meta, not views

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        assert name not in READS, f"{name}: a host read"
        if name == "aten::index":
            assert not any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]), "boolean mask"
        if name == "aten::_to_copy" and "device" in kwargs:
            crosses = args[0].device.type != torch.device(kwargs["device"]).type
            assert not crosses or kwargs.get("non_blocking"), f"a blocking copy {args[0].device} -> {kwargs['device']}"
        out = func(*args, **kwargs)
        if not func.is_view and any(isinstance(t, torch.Tensor) and t.is_meta for t in _tensors(out)):
            self.device_ops[name] += 1  # a kernel on a GPU (a view launches none)
        return out


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for item in x for t in _tensors(item)] if isinstance(x, (list, tuple)) else []


def on(device, batch: dict) -> dict:
    """The batch with every tensor on `device` (slime's is on the GPU: tokens, masks, log-probs, advantages)."""
    return {k: [x.to(device) if isinstance(x, torch.Tensor) else x for x in v] for k, v in batch.items()}


def case_batch(n_samples: int = 8, vocab: int = 64, seed: int = 0):
    policy = hazards.synthetic_policy(vocab, seed)
    batch = hazards.build("healthy", policy, case.rollout(vocab, seed, n_samples=n_samples), seed)
    batch.pop("hazard_site", None)
    batch.pop("rewards", None)
    return batch, hazards.packed_logits(policy, batch["unconcat_tokens"])


CONFIGS = {
    "case flags": {},
    "every term": dict(kl_loss_coef=0.01, entropy_coef=0.001, use_tis=True),
    "per-token k3": dict(calculate_per_token_loss=True, kl_loss_type="k3", kl_loss_coef=0.01),
}


def run_on_meta(module, args, batch, logits, par=Parallel()) -> NoHostWait:
    x, batch = logits.to("meta").requires_grad_(True), on("meta", batch)
    with NoHostWait() as mode:
        loss, _, log = module.loss_function(args, batch, 1, x, parallel=par)
        loss.backward()
    assert loss.is_meta and log["values"].is_meta and x.grad.is_meta and x.grad.shape == x.shape
    assert log["values"].shape == (1 + len(log["keys"]),)
    return mode


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("module", [as_is, safe], ids=["as_is", "safe"])
def test_both_losses_run_with_every_tensor_on_meta(module, config):
    batch, logits = case_batch()
    run_on_meta(module, case.args(global_batch_size=8, **CONFIGS[config]), batch, logits)


@pytest.mark.parametrize("cp_rank", [0, 1])
@pytest.mark.parametrize("module", [as_is, safe], ids=["as_is", "safe"])
def test_a_cp_rank_runs_on_meta(module, cp_rank):
    batch, full = case_batch()
    par = Parallel(cp_rank=cp_rank, cp_size=2, dp_cp_size=2)
    local = microbatch.cp_local_logits(full, batch["total_lengths"], par)
    run_on_meta(module, case.args(global_batch_size=8), microbatch.slice_for_cp(batch, par), local, par)


def test_the_safe_metrics_keep_their_keys_on_meta():
    batch, logits = case_batch()
    x = logits.to("meta").requires_grad_(True)
    _, _, log = safe.loss_function(case.args(global_batch_size=8), on("meta", batch), 1, x, parallel=Parallel())
    assert [k for k in log["keys"] if k.startswith("nan_guard/")] == [
        "nan_guard/log_probs", "nan_guard/rollout_log_probs", "nan_guard/ref_log_probs", "nan_guard/advantages",
        "nan_guard/exp_overflow", "nan_guard/dropped_tokens",
    ]  # fmt: skip


def test_the_meta_check_can_fail_on_a_cpu_tensor_mixed_in():
    batch, logits = case_batch()
    mixed = on("meta", batch)
    mixed["advantages"][3] = batch["advantages"][3]  # one sample's advantages left on the CPU
    with pytest.raises(RuntimeError, match="meta"):
        as_is.loss_function(case.args(global_batch_size=8), mixed, 1, logits.to("meta"), parallel=Parallel())


def test_the_meta_check_can_fail_on_a_host_read_and_on_a_blocking_copy():
    with NoHostWait(), pytest.raises(AssertionError, match="_local_scalar_dense: a host read"):
        bool(torch.zeros(4).sum())
    with pytest.raises(RuntimeError, match="meta"):  # and meta itself has no data to read
        bool(torch.zeros(4, device="meta").sum())
    with NoHostWait(), pytest.raises(AssertionError, match="blocking copy"):
        torch.arange(4).to("meta")
    with NoHostWait():
        devices.to_device(torch.arange(4), "meta")  # the loss's way: no wait


def guard_ops(n_samples: int) -> int:
    """Device ops of safe minus as-is on one micro-batch of `n_samples` (forward and backward, on meta)."""
    batch, logits = case_batch(n_samples)
    args = case.args(global_batch_size=n_samples, use_tis=True, kl_loss_coef=0.01)
    ops = [sum(run_on_meta(m, args, batch, logits).device_ops.values()) for m in (as_is, safe)]
    return ops[1] - ops[0]


def test_the_guards_device_ops_do_not_grow_with_the_samples():
    # the per-sample work is batched: 4 and 24 samples take the same guard ops (the release's own reducer loops
    # over samples on both sides alike)
    assert guard_ops(4) == guard_ops(24)


def test_to_device_keeps_a_tensor_already_there():
    t = torch.arange(3)
    assert devices.to_device(t, "cpu") is t and devices.to_device(t, torch.device("cpu")) is t
    assert devices.to_device(t, "meta").is_meta
    assert devices.full(2.0, "meta").shape == () and float(devices.full(2.0, "cpu")) == 2.0


def test_the_gpu_tiers_loss_checks_hold_on_the_cpu():
    # tests/gpu/scenarios/loss_cuda.py's checks, run here on the CPU at a small size (the tier itself needs CUDA)
    from tests.gpu.scenarios import loss_cuda

    assert all(r["loss"] and r["grad"] for r in loss_cuda.bitwise("cpu", tokens=512, vocab=256).values())
    o = loss_cuda.overflow("cpu")
    assert o["masked"] and o["ref_minus_old"] > 88.72 and o["as_is_nan_grad_entries"] > 0
    assert o["safe_grad_finite"] and o["safe_equals_as_is_on_defused"]
