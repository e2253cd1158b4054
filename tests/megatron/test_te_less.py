"""megatron-core 0.15.0rc0's gaps without TransformerEngine (`nanscope.megatron.te_less`): each fails without its
shim, works with it, and says so; where TransformerEngine is importable nothing is applied. Real megatron-core, in a
fresh interpreter each (no CPU layer: its own stand-in for the router's GEMM would hide the gap)."""

import json
import os
import subprocess
import sys

import pytest

GAPS = """
import json, sys, torch
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer.moe.moe_utils import RouterGatingLinearFunction

def config():  # the case's: --optimizer-cpu-offload --use-precision-aware-optimizer (the HybridDeviceOptimizer)
    return OptimizerConfig(optimizer="adam", bf16=True, params_dtype=torch.bfloat16, use_distributed_optimizer=True,
                           optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
                           use_precision_aware_optimizer=True)

inp, weight = torch.randn(4, 8), torch.randn(3, 8)
out = {}
for when in ("before", "after"):
    if when == "after":
        from nanscope.megatron import te_less
        out["applied"] = te_less.apply()
        out["again"] = te_less.apply()
        out["record"] = te_less.applied()
    try:
        out[when + "_config"] = config().store_param_remainders
    except Exception as e:
        out[when + "_config"] = type(e).__name__
    try:
        got = RouterGatingLinearFunction.apply(inp, weight, torch.float32)
        out[when + "_router"] = torch.equal(got, inp @ weight.t())
    except Exception as e:
        out[when + "_router"] = type(e).__name__
print(json.dumps(out))
"""

SHIMS = [
    "megatron.core.optimizer.optimizer_config.is_te_min_version",
    "megatron.core.transformer.moe.moe_utils.te_general_gemm",
]


def _python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=180)  # fmt: skip


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
@pytest.mark.timeout(240)
def test_without_te_each_gap_fails_and_its_shim_closes_it_once_with_one_line():
    proc = _python(GAPS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert (out["before_config"], out["before_router"]) == ("TypeError", "NameError")
    assert out["after_config"] is False and out["after_router"] is True  # remainders off, as for a TE < 2.1.0
    assert out["applied"] == out["again"] == out["record"] == SHIMS
    lines = [line for line in proc.stderr.splitlines() if line.startswith("nanscope: warning: TransformerEngine")]
    assert lines == [
        "nanscope: warning: TransformerEngine is absent: shimmed megatron-core's optimizer_config.is_te_min_version "
        "answers False (the precision-aware optimizer's TE version check)",
        "nanscope: warning: TransformerEngine is absent: shimmed megatron-core's moe_utils.te_general_gemm = None "
        "(the MoE router's GEMM is torch.mm)",
    ]


@pytest.mark.timeout(240)
def test_where_transformer_engine_is_importable_nothing_is_applied_nor_imported(tmp_path):
    (tmp_path / "transformer_engine").mkdir()
    (tmp_path / "transformer_engine" / "__init__.py").write_text('__version__ = "2.6.0"\n')
    code = (
        "import json, sys\n"
        "from nanscope.megatron import te_less\n"
        "print(json.dumps([te_less.te_present(), te_less.apply(), te_less.applied(), 'megatron.core' in sys.modules]))\n"
    )
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = _python(code, {"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, [], [], False]
    assert "nanscope:" not in proc.stderr


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_the_cpu_layers_router_stand_in_leaves_the_shim_nothing_to_do():
    code = (
        "import json\n"
        "from nanscope.megatron import bootstrap, cpu, te_less\n"
        "bootstrap.import_megatron(); cpu.install()\n"
        "print(json.dumps(te_less.apply()))\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [SHIMS[0]]
