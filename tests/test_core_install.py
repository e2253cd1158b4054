"""The core install (no megatron-core, no rich) is enough for what runs inside a training image.

Each import runs in a fresh interpreter whose import system refuses `megatron` and `rich`, as on a
training image that has Megatron-LM only on PYTHONPATH of its own job and no nanscope extras.
"""

import subprocess
import sys

import pytest

BLOCK = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("megatron", "rich"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, Refuse())
"""

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
def test_imports_without_megatron_core_and_rich(module):
    code = BLOCK + f"import {module}\nassert not any(m.split('.')[0] in ('megatron', 'rich') for m in sys.modules)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_block_can_fail():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK + "import megatron.core"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "blocked by the test" in proc.stderr
