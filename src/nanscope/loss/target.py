"""Which loss module the guard wraps: a slime release's, identified by its signatures, or nanscope's model of v0.1.0.

What the guard needs from a release is data (`nanscope.facts.releases.LossApi`: the signatures that identify
it, the exp helpers, the CP slicer). This module binds that data to a loaded loss module and checks it:

    identify    the first release whose every recorded signature the loaded modules match, else
                UnsupportedRelease naming the closest release and what differs (never a silent fallback)
    bind        identify once, then a Target (the release's API, the module, its CP slicer)
    running     the loss module this process runs: slime's if slime is importable, else nanscope's model

Without slime installed (nanscope's CPU harness) the guard wraps `nanscope.loss.as_is`, nanscope's model
of slime v0.1.0 (`MODEL`): it plays the role of slime's loss module there.

    from nanscope.loss import target
    t = target.running()     # checked; UnsupportedRelease if the running slime is unknown
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType, ModuleType

import torch

from nanscope.errors import UserError
from nanscope.facts.releases import (
    CUSTOM_LOSS_PARAMETERS,
    EXP_FIRST,
    EXP_NEG_FIRST,
    LOSS_APIS,
    PPO_PARAMETERS,
    SLIME_LOSS,
    LossApi,
)
from nanscope.loss import as_is

MODEL_LOSS = "nanscope.loss.as_is"


class UnsupportedRelease(UserError):
    """The running slime's loss module is not one the plugin knows; it refuses instead of guessing."""


MODEL = LossApi(
    name="nanscope's model of slime v0.1.0 (nanscope.loss.as_is; slime is not installed)",
    module=MODEL_LOSS,
    entry="policy_loss",
    signatures=MappingProxyType(
        {
            f"{MODEL_LOSS}.policy_loss": CUSTOM_LOSS_PARAMETERS + ("parallel",),
            f"{MODEL_LOSS}.ppo_clip_loss": PPO_PARAMETERS,
            f"{MODEL_LOSS}.approx_kl": ("log_ratio", "kl_loss_type"),
            f"{MODEL_LOSS}.tis_weights": ("log_ratio", "tis_clip_low", "tis_clip"),
        }
    ),
    clamps=MappingProxyType({"ppo_clip_loss": EXP_NEG_FIRST, "approx_kl": EXP_NEG_FIRST, "tis_weights": EXP_FIRST}),
    inline_exp=False,
    slicer=None,
    log_prob_helper="log_probs_and_entropy",
    log_prob_returns="tensors",
    schedule_module="nanscope.megatron.step",  # the CPU harness's train_one_step
)


@dataclass(frozen=True)
class Target:
    """A release bound to its loaded loss module: what the guard calls and patches."""

    release: LossApi
    module: ModuleType
    slicer: Callable | None = None

    @property
    def entry(self) -> Callable:
        return getattr(self.module, self.release.entry)


def _parameters(qualname: str) -> tuple[str, ...] | None:
    """Parameter names of `module.function` as loaded, None if the module or function is missing."""
    module_name, _, name = qualname.rpartition(".")
    module = sys.modules.get(module_name)
    fn = getattr(module, name, None)
    if not callable(fn):
        return None
    return tuple(inspect.signature(fn).parameters)


def mismatches(release: LossApi) -> list[str]:
    """What the loaded modules lack for `release`, one phrase per name; empty if it matches."""
    out = []
    if release.inline_exp and getattr(sys.modules.get(release.module), "torch", None) is not torch:
        out.append(f"{release.module}.torch is not the torch module")
    for qualname, expected in release.signatures.items():
        found = _parameters(qualname)
        if found is None:
            out.append(f"{qualname} is missing")
        elif found != expected:
            out.append(f"{qualname}({', '.join(found)}) is not ({', '.join(expected)})")
    return out


def _installed_version() -> str:
    try:
        return f"slime {importlib.metadata.version('slime')} (installed metadata)"
    except importlib.metadata.PackageNotFoundError:
        return "slime (no installed metadata)"


def identify(candidates: tuple[LossApi, ...] = LOSS_APIS) -> LossApi:
    """The first of `candidates` that the loaded modules match exactly.

    Raises:
        UnsupportedRelease: none matches; one line naming the closest release, what differs from it
            and the releases the plugin supports.
    """
    found = [(mismatches(r), r) for r in candidates]
    for missing, release in found:
        if not missing:
            return release
    missing, closest = min(found, key=lambda mr: len(mr[0]))
    supported = ", ".join(r.name for r in reversed(candidates))  # oldest first
    raise UnsupportedRelease(
        f"nanscope.slime_plugin: {_installed_version()} is not a release the plugin knows: closest is "
        f"{closest.name}, but {missing[0]}; supported: {supported}"
    )


def bind(module: ModuleType, candidates: tuple[LossApi, ...] = LOSS_APIS) -> Target:
    """Identify and check `module`, then return its Target (the caller keeps it: identifying reads signatures)."""
    release = identify(candidates)
    slicer = None
    if release.slicer is not None:
        cp_module, _, name = release.slicer.rpartition(".")
        slicer = getattr(sys.modules[cp_module], name)
    return Target(release, module, slicer)


def model() -> Target:
    """nanscope's own model of slime v0.1.0 (`nanscope.loss.as_is`) as a Target: nanscope's code, not checked."""
    return Target(MODEL, as_is)


def running() -> Target:
    """The loss module this process runs, identified and checked.

    slime's loss module is the one that calls the plugin, so it is normally imported already; it is
    imported here if slime is installed but that module is not loaded yet. Without slime installed the
    target is nanscope's model of v0.1.0 (the CPU harness), named as such in `Target.release.name`.
    """
    module = sys.modules.get(SLIME_LOSS)
    if module is None and importlib.util.find_spec("slime") is not None:
        module = importlib.import_module(SLIME_LOSS)
    if module is None:
        return bind(as_is, (MODEL,))
    return bind(module)
