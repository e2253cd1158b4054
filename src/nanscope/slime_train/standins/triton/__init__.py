"""Stand-in for Triton, for slime's module-level import only (utils/fp8_kernel.py:2-3, reached from
megatron_to_hf/__init__.py:12 through update_weight_utils.py and actor.py:28).

slime's fp8 weight-cast kernel is defined at import and runs only when weights go to SGLang in fp8, which a
--debug-train-only run never does: `jit` keeps the function, and calling it raises.

To everything but slime, Triton stays absent. torch and megatron-core probe for Triton on their own (torch's
`has_triton_package`, cached, then `triton.language.dtype`, `triton.backends`; megatron-core's fusions): a first
import from outside `slime.` raises ImportError here, as a missing package does, and `__version__` is below 3.4,
which megatron-core reads as no Triton on a machine without CUDA (fusions/fused_indices_converter.py:15). nanscope's
worker hook asks torch first (`nanscope.slime_train.worker.setup`), so torch has its answer before slime imports this.
"""

import sys

__version__ = "0.0.0+nanscope.standin"


def _importer() -> str:
    """The module whose import statement is executing this one (import machinery frames skipped)."""
    frame = sys._getframe(2)  # 0: this function, 1: this module's body, 2: the import machinery or the importer
    while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


if not _importer().startswith("slime."):
    raise ImportError("No module named 'triton' (nanscope's Triton stand-in serves slime's fp8_kernel import only)")

from triton import language  # noqa: E402,F401


def jit(fn=None, **kwargs):
    if fn is None:
        return jit

    def refuse(*args, **kwargs):
        raise RuntimeError(f"nanscope's Triton stand-in: kernel {fn.__name__} cannot run on CPU")

    refuse.__name__ = fn.__name__
    return refuse


def cdiv(a: int, b: int) -> int:
    return -(a // -b)
