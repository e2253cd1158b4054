"""The CPU compatibility layer: every patch does what its comment says, and undoes cleanly; the harness
switches it on itself, also where CUDA is visible."""

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanscope import case
from nanscope.megatron import cpu

PATCHED = [
    "torch.cuda.current_device",
    "torch.tensor",
    "torch.zeros",
    "torch.ones",
    "Tensor.cuda",
    "Tensor.type",
    "torch.cuda.synchronize",
    "CudaRNGStatesTracker.add",
    "CudaRNGStatesTracker.fork",
    "megatron.core.tensor_parallel.random._get_cuda_rng_state",
    "megatron.core.tensor_parallel.random._set_cuda_rng_state",
    "megatron.core.transformer.moe.moe_utils.te_general_gemm",
]


@pytest.fixture
def installed():
    names = cpu.install()
    try:
        yield names
    finally:
        cpu.uninstall()


def test_install_lists_every_patch_once_and_is_idempotent(installed):
    assert installed == PATCHED
    assert cpu.install() == PATCHED  # a second install changes nothing


def test_uninstall_restores_torch():
    from megatron.core.transformer.moe import moe_utils

    original = (torch.tensor, torch.zeros, torch.ones, torch.Tensor.cuda, torch.Tensor.type, torch.cuda.current_device)
    had_te_gemm = hasattr(moe_utils, "te_general_gemm")
    cpu.install()
    cpu.uninstall()
    assert (
        torch.tensor,
        torch.zeros,
        torch.ones,
        torch.Tensor.cuda,
        torch.Tensor.type,
        torch.cuda.current_device,
    ) == original
    assert cpu.installed() == []
    assert hasattr(moe_utils, "te_general_gemm") == had_te_gemm  # absent without TransformerEngine, as before


def test_installs_where_cuda_is_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    try:
        assert cpu.install() == PATCHED
        assert torch.zeros(1, device="cuda").device.type == "cpu"
    finally:
        cpu.uninstall()


@pytest.mark.slow  # a model and two steps: the fast tier installs the CPU layer where CUDA is visible, above
@pytest.mark.integration
@pytest.mark.timeout(200)
def test_harness_builds_and_steps_on_cpu_where_cuda_is_visible(tmp_path):
    # A process where torch.cuda.is_available() is True and one device is counted, as on a GPU
    # machine: bootstrap.init, the model, a healthy step and megatron's NaN check still run on CPU.
    worker = Path(__file__).with_name("cuda_visible_worker.py")
    proc = subprocess.run([sys.executable, str(worker), str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.splitlines()[-1])
    if "skip" in doc:
        pytest.skip(doc["skip"])
    assert doc["patched"] == PATCHED
    healthy, hazard = doc["records"]
    assert healthy["ok"] and healthy["params_finite"], healthy["error"]
    assert len(healthy["optimizer_grad_norm"]) == 1 and healthy["optimizer_grad_norm"][0] > 0
    assert not hazard["ok"]
    assert hazard["error"].startswith("Rank 0, node ") and ", device cpu, iteration -1: " in hazard["error"]
    assert hazard["error"].endswith(case.nan_check_message())
    # One stage: the no-pipelining schedule, then the case's frames from finalize_model_grads on.
    assert [tuple(f) for f in hazard["frames"][1:]] == list(case.frames())[1:]


def test_factories_with_cuda_literal_land_on_cpu(installed):
    assert torch.tensor([1.0], device="cuda").device.type == "cpu"
    assert torch.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
    assert torch.ones(2, 2, device="cuda").sum().item() == 4.0
    assert torch.zeros(3, device=torch.cuda.current_device()).device.type == "cpu"
    assert torch.tensor([2]).device.type == "cpu"  # no device: unchanged


def test_tensor_cuda_and_synchronize(installed):
    x = torch.ones(2)
    assert x.cuda() is x
    assert torch.cuda.synchronize() is None


def test_type_names_cuda_twin_only_without_argument(installed):
    # Float16OptimizerWithFloat16Params / clip_grads compare against these exact strings.
    assert torch.empty(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    assert torch.empty(1).type() == "torch.cuda.FloatTensor"
    # With a target type it still casts, as Tensor.type does.
    assert torch.ones(1).type(torch.float64).dtype == torch.float64


def test_type_name_is_the_same_under_a_torch_function_mode(installed):
    # The tracer runs the optimizer step under a TorchFunctionMode, where Tensor.type's C method
    # dispatches back to the patch: the name was 'torch.cuda.cuda.FloatTensor' and clip_grads asserted.
    from torch.overrides import TorchFunctionMode

    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():
        assert torch.empty(1).type() == "torch.cuda.FloatTensor"


def test_rng_tracker_fork_is_reproducible_and_restores_outer_state(installed):
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    tracker = CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 1234)
    torch.manual_seed(0)
    with tracker.fork():
        a = torch.rand(3)
    outer = torch.rand(3)
    torch.manual_seed(0)
    expected_outer = torch.rand(3)
    assert torch.equal(outer, expected_outer)  # fork did not consume the default generator
    # The forked stream is seed 1234's stream, and it advances across forks.
    assert torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(1234)))
    with tracker.fork():
        b = torch.rand(3)
    g = torch.Generator().manual_seed(1234)
    torch.rand(3, generator=g)
    assert torch.equal(b, torch.rand(3, generator=g))
    with pytest.raises(Exception, match="already exists"):
        tracker.add("other", 1234)


def test_router_gemm_falls_back_to_torch_mm(installed):
    from megatron.core.transformer.moe.moe_utils import RouterGatingLinearFunction

    inp, weight = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(3, 8, dtype=torch.bfloat16)
    out = RouterGatingLinearFunction.apply(inp, weight, torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, inp.float() @ weight.float().t())


def test_every_patch_has_a_comment_naming_what_it_replaces():
    source = inspect.getsource(cpu.install)
    lines = source.splitlines()
    tuples = [i for i, line in enumerate(lines) if line.strip().startswith("(") and line.strip().endswith("),")]
    assert len(tuples) == len(PATCHED)
    for i in tuples:
        above = lines[i - 1].strip()
        assert above.startswith("#") or lines[i - 2].strip().startswith("#"), lines[i]
    ast.parse(inspect.getsource(cpu))  # the module stays importable as written
