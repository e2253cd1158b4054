"""The CPU layer's driver patch for a CPU run of slime's train.py (`nanscope repro --slime-src`).

Python imports `sitecustomize` at startup from the first directory of sys.path that holds one; the run puts this
directory first on PYTHONPATH, so this runs before train.py, which stays the driver's top frame. It patches the one
CUDA-only call the driver makes (`nanscope.megatron.cpu.install_driver`: Megatron-LM's validate_args asks for the
GPU's compute capability), and only in the run's driver (NANSCOPE_SLIME_DRIVER set: the train.py process alone;
Ray's workers, started by the raylet with the job's env_vars, never have it). The workers get their patches from
Ray's worker_process_setup_hook (`nanscope.slime_train.worker`). A sitecustomize that this one
shadows on sys.path is then run as Python would have run it.
"""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("NANSCOPE_SLIME_DRIVER"):
    from nanscope.megatron import cpu

    cpu.install_driver()


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_run_shadowed()
