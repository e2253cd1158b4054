"""Load a slime checkout's loss module on this CPU machine, with the fewest stand-ins possible.

slime's loss path needs torch, megatron-core and slime's own modules, all real here. What a checkout
would also pull in at import time, and is not installed here, is replaced in sys.modules only:

- `slime`, `slime.backends`, `slime.backends.megatron_utils`, `slime.utils`: package objects whose
  __path__ is the checkout's directory, so submodules load from the checkout's files but the package
  __init__s do not run (they import the Ray actor, SGLang, transformers, torch_memory_saver, deep_ep);
- `slime.utils.http_utils`: `is_port_available` only (slime.utils.misc imports it at module level;
  the real module needs httpx/uvicorn); the loss never calls it;
- `ray`: an empty module (v0.2.x's slime.utils.misc imports it at module level; the loss never uses it).

For slime v0.1.0's model module (`load_model_module`: its train_one_step and train), also:

- `megatron.training.{global_vars,training,checkpointing,arguments}`: the names model.py (and checkpoint.py,
  model_provider.py) import from Megatron-LM, which the megatron-core wheel lacks: `megatron_training.py` in
  this directory, which says why none of them is on the loss or step path;
- `wandb`: `Wandb`, which records what is logged (v0.1.0's model.py and data.py import wandb at module level;
  train() calls wandb.log under --use-wandb, and so does the plugin's v0.1.0 logging path);
- `slime.backends.utils`: a package object like the four above (its __init__ is empty in v0.1.0; data.py's
  DataIterator lives there).

Nothing here is imported by nanscope itself: these exist in the test process only (the slime packages,
`slime.utils.http_utils` and `ray` are put in place by `nanscope.trace.bundles.slime_import.stand_in`, which the offline
replay uses too).
"""

import importlib
import sys
import types
from pathlib import Path

from nanscope.trace.bundles import slime_import

PACKAGES = ("slime", "slime.backends", "slime.backends.megatron_utils", "slime.utils")
MEGATRON_TRAINING = (
    "megatron.training",
    "megatron.training.global_vars",
    "megatron.training.training",
    "megatron.training.checkpointing",
    "megatron.training.arguments",
)


def load_loss_module(checkout: Path) -> types.ModuleType:
    """Import `slime.backends.megatron_utils.loss` from `checkout` (a directory holding `slime/`)."""
    return load_module(checkout, "slime.backends.megatron_utils.loss")


def load_module(checkout: Path, module: str, packages: tuple[str, ...] = PACKAGES) -> types.ModuleType:
    """Import slime's `module` from `checkout` (a directory holding `slime/`), with the stand-ins above."""
    path = checkout.joinpath(*module.split(".")).with_suffix(".py")
    assert path.is_file(), f"not in this slime checkout: {path}"
    slime_import.stand_in(checkout, packages)
    return importlib.import_module(module)


class Wandb(types.ModuleType):
    """A `wandb` module that records calls: `calls` holds (function, positional args, keyword args)."""

    def __init__(self):
        super().__init__("wandb")
        self.calls: list[tuple[str, tuple, dict]] = []
        for name in ("log", "define_metric", "alert", "init", "finish"):
            setattr(self, name, self._recorder(name))

    def _recorder(self, name: str):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))

        return record

    def logged(self) -> list[dict]:
        """Every dict passed to wandb.log, in order."""
        return [args[0] for name, args, _ in self.calls if name == "log"]


def install_megatron_training() -> types.ModuleType:
    """Put `megatron_training` (this directory) into sys.modules under Megatron-LM's module names; returns it."""
    from tests.slime_releases import megatron_training

    for name in MEGATRON_TRAINING:
        sys.modules[name] = megatron_training
    return megatron_training


def load_model_module(checkout: Path) -> tuple[types.ModuleType, Wandb]:
    """Import slime's `slime.backends.megatron_utils.model` (v0.1.0) from `checkout` with every stand-in above.

    Returns:
        (the model module, the recording wandb module)
    """
    install_megatron_training()
    wandb = sys.modules["wandb"] = Wandb()
    packages = (*PACKAGES, "slime.backends.utils")
    return load_module(checkout, "slime.backends.megatron_utils.model", packages), wandb
