"""Importing nanscope.verl_plugin: what it registers in verl, and the one line it refuses with.

Each case imports the plugin in a fresh interpreter (the import installs once per process), with verl v0.9.0 from
the verl environment, or verl v0.7.1's tree from shared/verl-src. Needs verl; plain `pytest` without it skips.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[2]
V071 = ROOT.parent / "shared" / "verl-src" / "v0.7.1"

REGISTERED = """
import nanscope.verl_plugin as p
from verl.trainer.ppo import core_algos
from verl.workers.engine.base import EngineRegistry
from verl.utils.device import get_device_name, get_vendor
print(type(core_algos.get_policy_loss_fn("nanscope")).__name__, p.INSTALLED.loss.inner)
for model_type in ("language_model", "value_model"):
    cls = EngineRegistry.get_engine_cls(model_type, "fsdp2")
    print(model_type, cls.__name__, cls.__mro__[2].__name__, cls.nanscope_role)
import importlib; importlib.reload(p)  # a second install finds its loss registered: nothing more
print("again", p.INSTALLED)
"""


def _python(code, env=None, pythonpath=None):
    paths = [str(ROOT / "src")] + ([str(pythonpath)] if pythonpath else [])
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(env or {})}
    full = {k: v for k, v in full.items() if not (k.startswith("NANSCOPE_") and k not in (env or {}))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=240)


@pytest.mark.timeout(300)
def test_the_import_registers_the_loss_mode_and_wraps_the_engine_verl_would_pick():
    out = _python(REGISTERED, env={"NANSCOPE_INNER_LOSS_MODE": "clip_cov"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "GuardedLoss clip_cov"
    assert lines[1] == "language_model NanscopeFSDPEngineWithLMHead FSDPEngineWithLMHead actor"
    assert lines[2] == "value_model NanscopeFSDPEngineWithValueHead FSDPEngineWithValueHead critic"
    assert lines[3] == "again None"


def _last_line(out):
    return out.stderr.strip().splitlines()[-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"NANSCOPE_ON_NONFINITE": "sometimes"}, "ValueError: NANSCOPE_ON_NONFINITE='sometimes': expected one of"),
        ({"NANSCOPE_INNER_LOSS_MODE": "nanscope"}, "ValueError: NANSCOPE_INNER_LOSS_MODE='nanscope': expected one"),
        ({"NANSCOPE_INNER_LOSS_MODE": "vanila"}, "ValueError: NANSCOPE_INNER_LOSS_MODE='vanila': expected one of"),
        ({"NANSCOPE_MAX_SKIPS": "0"}, "ValueError: NANSCOPE_MAX_SKIPS='0': expected an integer >= 1"),
    ],
)
def test_a_bad_setting_fails_the_import_in_one_line(env, line):
    out = _python("import nanscope.verl_plugin", env=env)
    assert out.returncode == 1
    assert _last_line(out).startswith(line), out.stderr[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not V071.is_dir(), reason="no verl v0.7.1 tree in shared/verl-src")
def test_verl_0_7_1_is_refused_in_one_line_saying_why():
    out = _python("import nanscope.verl_plugin", pythonpath=V071)
    assert out.returncode == 1, out.stdout[-2000:]
    last = _last_line(out)
    assert last.startswith("RuntimeError: nanscope.verl_plugin: verl 0.7.1 is not supported: "), out.stderr[-3000:]
    assert "DataParallelPPOActor" in last and "(device, vendor)" in last
