"""slime's own loss module, imported off the cluster for an offline replay, and the parallel state it reads.

`nanscope trace BUNDLE` replays a loss through the release that wrote the bundle when slime is importable: an
installed slime (the training image), or a checkout named by `--slime-src DIR` (a directory holding `slime/`,
or one checkout per release: DIR/v0.1.0, DIR/v0.2.4, DIR/v0.3.1, DIR/main). slime's loss path needs torch and
megatron-core (the `[repro]` extra brings both); what a checkout also imports at import time and the loss never
calls is stood in for, in sys.modules only, while the loss module loads:

    slime, slime.backends, slime.backends.megatron_utils, slime.backends.utils, slime.utils
                 package objects whose __path__ is the checkout's, so submodules load from its files but the
                 package __init__s (the Ray actor, SGLang, transformers, ...) never run
    slime.utils.http_utils   `is_port_available` only (slime.utils.misc imports it; needs httpx/uvicorn)
    ray          an empty module (v0.2's slime.utils.misc imports it; the loss never uses it)
    torch.compile            the identity while slime's modules load: v0.1.0's helpers are @torch.compile'd,
                             and the tracer must see their aten ops one by one (eager, and no dynamo import)

`checkout_loss(dir)` puts everything back when the block ends (the loss module included), so a replay leaves
the process as it found it. `parallel(cp_rank, cp_size, dp_size)` stands in for megatron-core's parallel
state while the replay runs: the bundle's CP coordinate, one tensor-parallel rank, the last pipeline stage.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

from nanscope.errors import UserError
from nanscope.facts.releases import BY_KEY, SLIME_LOSS

PACKAGES = ("slime", "slime.backends", "slime.backends.megatron_utils", "slime.backends.utils", "slime.utils")
_LOSS_FILE = Path("slime", "backends", "megatron_utils", "loss.py")
_STUBS = ("slime.utils.http_utils", "ray")


def stand_in(checkout: Path, packages: tuple[str, ...] = PACKAGES) -> None:
    """Put slime's `packages` in sys.modules as namespaces on `checkout` (no package __init__ runs), and stand-ins
    for what its imports reach but an offline import never uses: http_utils' port check, and ray."""
    for name in packages:
        package = types.ModuleType(name)
        package.__path__ = [str(checkout.joinpath(*name.split(".")))]
        sys.modules[name] = package
    http_utils = types.ModuleType("slime.utils.http_utils")
    http_utils.is_port_available = lambda *args, **kwargs: True
    sys.modules["slime.utils.http_utils"] = http_utils
    sys.modules.setdefault("ray", types.ModuleType("ray"))


def find_checkout(src: str | Path, release_key: str | None = None) -> Path:
    """The checkout under `src` to import: `src` itself when it holds slime/, else `src/<release_key>`."""
    root = Path(src)
    if (root / _LOSS_FILE).is_file():
        return root
    if release_key is not None and (root / release_key / _LOSS_FILE).is_file():
        return root / release_key
    want = f" (nor {root / (release_key or '<release>') / _LOSS_FILE})" if release_key else ""
    known = ", ".join(BY_KEY)
    raise UserError(
        f"--slime-src {src}: no slime checkout there: expected {root / _LOSS_FILE}{want}; "
        f"give a checkout, or a directory of checkouts named {known}"
    )


def installed() -> bool:
    """Whether `import slime` would find an installed slime (the training image)."""
    try:
        return importlib.util.find_spec("slime") is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def checkout_loss(checkout: Path) -> Iterator[types.ModuleType]:
    """slime's loss module imported from `checkout` with the stand-ins above; sys.modules restored on exit."""
    _need_megatron()
    before = dict(sys.modules)
    for name in [n for n in before if n.split(".")[0] == "slime"]:  # another release's modules: out of the way
        del sys.modules[name]
    try:
        stand_in(checkout)
        yield _import_eagerly(SLIME_LOSS, f"the slime checkout {checkout}")
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "slime" or (n in _STUBS and n not in before)]:
            del sys.modules[name]
        sys.modules.update({n: m for n, m in before.items() if n.split(".")[0] == "slime" or n in _STUBS})


def installed_loss() -> types.ModuleType:
    """The installed slime's loss module (imported as slime imports it: its package __init__s run)."""
    _need_megatron()
    return _import_eagerly(SLIME_LOSS, "the installed slime")


def _import_eagerly(name: str, where: str) -> types.ModuleType:
    import torch  # heavy: torch, only a replay through slime imports it

    compile_ = torch.compile
    torch.compile = _identity_compile
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron-core's "Transformer Engine and Apex are not installed"
            return importlib.import_module(name)
    except ImportError as e:
        raise UserError(f"cannot import slime's loss from {where}: {type(e).__name__}: {e}") from None
    finally:
        torch.compile = compile_


def _identity_compile(fn=None, **_):
    """torch.compile's stand-in: `@torch.compile` and `@torch.compile(dynamic=True)` both leave `fn` as it is."""
    return fn if fn is not None else (lambda f: f)


def _need_megatron() -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron-core's "Transformer Engine and Apex are not installed"
            importlib.import_module("megatron.core.parallel_state")
    except ImportError:
        raise UserError(
            "slime's loss imports megatron-core, which is not installed here: pip install 'nanscope[repro]', "
            "or replay without --slime-src (nanscope's model of slime v0.1.0)"
        ) from None


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """torch.compile'd functions run eagerly inside the block (when dynamo is loaded at all)."""
    dynamo = sys.modules.get("torch._dynamo")
    stance = getattr(sys.modules.get("torch.compiler"), "set_stance", None)
    if dynamo is None or stance is None:
        yield
        return
    with stance("force_eager"):
        yield


@contextlib.contextmanager
def parallel(cp_rank: int, cp_size: int, dp_size: int = 1) -> Iterator[None]:
    """megatron-core's parallel state as the bundle's rank saw it, for the loss path only (no process group).

    The loss reads the context-parallel coordinate (its zigzag slicer, its per-sample-mean reducer), the
    data-parallel size (the loss scale), and the tensor-parallel group (the log-prob helper, which the replay
    replaces); a collective over CP ranks (gspo, OPSM, --allgather-cp) cannot run from one rank's bundle.
    """
    from megatron.core import parallel_state as ps  # optional: the [repro] extra; checked by the loaders

    def world(with_context_parallel=False, **_):
        return dp_size * cp_size if with_context_parallel else dp_size

    def tp_group(*_, **__):
        return ps._TENSOR_MODEL_PARALLEL_GROUP if ps.model_parallel_is_initialized() else None

    stand_ins = {
        "get_context_parallel_world_size": lambda: cp_size,
        "get_context_parallel_rank": lambda: cp_rank,
        "get_data_parallel_world_size": world,
        "get_data_parallel_rank": lambda *_, **__: 0,
        "is_pipeline_last_stage": lambda *_, **__: True,
        "get_tensor_model_parallel_world_size": lambda: 1,
        "get_tensor_model_parallel_rank": lambda: 0,
        "get_tensor_model_parallel_group": tp_group,
        "get_context_parallel_group": lambda *_, **__: None,  # read before a CP-1 early return (all_gather_with_cp)
    }
    saved = {name: getattr(ps, name) for name in stand_ins}
    try:
        for name, fn in stand_ins.items():
            setattr(ps, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(ps, name, fn)
