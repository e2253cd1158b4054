"""The core install (no megatron-core, no rich, no wandb, no TensorBoard) is enough for what runs inside a training image.

Each import runs in a fresh interpreter whose import system refuses `megatron`, `rich`, `wandb` and
`tensorboard`, as on a training image that has Megatron-LM only on PYTHONPATH of its own job and no nanscope
extras. pyproject's core dependencies name none of them: wandb and TensorBoard are the `logging` extra
(slime's own loggers, which the `test` extra brings for the tests that read the plugin's logs back).
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

BLOCKED = ("megatron", "rich", "wandb", "tensorboard")
BLOCK = f"""
import importlib.abc, sys
BLOCKED = {BLOCKED!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
        return None
sys.meta_path.insert(0, Refuse())
"""
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

CORE_MODULES = [
    "nanscope.slime_plugin",  # the custom loss and the before-train-step hook
    "nanscope.loss.as_is",
    "nanscope.loss.safe",
    "nanscope.dumps.checks",  # scan's reader and checks
    "nanscope.launch.script",  # doctor's parsing
    "nanscope.launch.config",
    "nanscope.launch.tracebacks",
    "nanscope.trace",
    "nanscope.case",
]


@pytest.mark.parametrize("module", CORE_MODULES)
def test_imports_without_megatron_core_rich_wandb_and_tensorboard(module):
    code = BLOCK + f"import {module}\nassert not any(m.split('.')[0] in {BLOCKED!r} for m in sys.modules)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_block_can_fail():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK + "import megatron.core"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "blocked by the test" in proc.stderr


def test_the_core_dependencies_leave_the_loggers_to_the_extras():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    names = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in project["dependencies"]}
    assert not names & {"wandb", "tensorboard", "megatron-core"}, names
    extras = project["optional-dependencies"]
    assert extras["logging"] == ["wandb==0.31.0", "tensorboard==2.21.0"]
    assert "nanscope[logging]" in extras["test"]  # the README's `pip install -e '.[repro,test]'` brings them
