"""Load a slime checkout's loss module on this CPU machine, with the fewest stand-ins possible.

slime's loss path needs torch, megatron-core and slime's own modules, all real here. What a checkout
would also pull in at import time, and is not installed here, is replaced in sys.modules only:

- `slime`, `slime.backends`, `slime.backends.megatron_utils`, `slime.utils`: package objects whose
  __path__ is the checkout's directory, so submodules load from the checkout's files but the package
  __init__s do not run (they import the Ray actor, SGLang, transformers, torch_memory_saver, deep_ep);
- `slime.utils.http_utils`: `is_port_available` only (slime.utils.misc imports it at module level;
  the real module needs httpx/uvicorn); the loss never calls it;
- `ray`: an empty module (v0.2.x's slime.utils.misc imports it at module level; the loss never uses it).

Nothing here is imported by nanscope itself: these exist in the test process only.
"""

import importlib
import sys
import types
from pathlib import Path

PACKAGES = ("slime", "slime.backends", "slime.backends.megatron_utils", "slime.utils")


def load_loss_module(checkout: Path) -> types.ModuleType:
    """Import `slime.backends.megatron_utils.loss` from `checkout` (a directory holding `slime/`)."""
    return load_module(checkout, "slime.backends.megatron_utils.loss")


def load_module(checkout: Path, module: str) -> types.ModuleType:
    """Import slime's `module` from `checkout` (a directory holding `slime/`), with the stand-ins above."""
    path = checkout.joinpath(*module.split(".")).with_suffix(".py")
    assert path.is_file(), f"not in this slime checkout: {path}"
    for name in PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = [str(checkout.joinpath(*name.split(".")))]
        sys.modules[name] = package
    http_utils = types.ModuleType("slime.utils.http_utils")
    http_utils.is_port_available = lambda *args, **kwargs: True
    sys.modules["slime.utils.http_utils"] = http_utils
    sys.modules.setdefault("ray", types.ModuleType("ray"))
    return importlib.import_module(module)
