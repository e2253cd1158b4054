"""The slime releases the plugin's loss can wrap: what it calls and patches in each, and the version check.

The plugin does not re-implement slime's policy loss: it calls the running release's own
`policy_loss_function` (see `nanscope.slime_plugin.loss`). What it needs from a release is small and
is recorded here, per release, as data:

    signatures  the functions it calls or patches, with their parameter names: this identifies the
                release and is checked on first use (a missing or changed name is refused, never
                worked around)
    clamps      the loss module's helpers that exponentiate a log-ratio, and which argument holds it
    inline_exp  the loss module calls `torch.exp` on a log-ratio inline (TIS, icepop, unbiased KL)
    slicer      the release's own CP slicer, to map a CP rank's tokens to response positions

Without slime installed (nanscope's CPU harness) the plugin wraps `nanscope.loss.as_is`, nanscope's
model of slime v0.1.0 (`MODEL`): it plays the role of slime's loss module there.

    from nanscope.slime_plugin import releases
    target = releases.running()     # the release this process runs, checked; UnsupportedRelease if unknown
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType

import torch

from nanscope import releases as known
from nanscope.errors import UserError

SLIME_LOSS = "slime.backends.megatron_utils.loss"
SLIME_CP = "slime.backends.megatron_utils.cp_utils"
MODEL_LOSS = "nanscope.loss.as_is"

# How a helper exponentiates its log-ratio argument(s); the guard clamps the log-ratio before the call.
EXP_NEG_FIRST = "exp(-x)"  # helper(x, ...) computes exp(-x)                  (PPO ratio, cispo, as_is's approx_kl)
EXP_FIRST = "exp(x)"  # helper(x, ...) computes exp(x)                        (as_is's tis_weights)
EXP_SECOND_MINUS_FIRST = "exp(b-a)"  # helper(a, b, ...) computes exp(b - a)  (slime's compute_approx_kl)


class UnsupportedRelease(UserError):
    """The running slime's loss module is not one the plugin knows; it refuses instead of guessing."""


@dataclass(frozen=True)
class Release:
    """What the plugin calls and patches in one slime release (see the module docstring).

    Attributes:
        name: as users know it ("v0.3.1").
        module: the loss module (its `policy loss` and exp helpers live there).
        entry: the policy loss the plugin calls, with slime's custom-loss signature.
        signatures: "module.function" -> parameter names; all must match for the release to be identified.
        clamps: helper in `module` -> how it exponentiates its log-ratio (EXP_*).
        inline_exp: `module` calls `torch.exp` on log-ratios inline; its `torch` global is patched.
        slicer: "module.function" of the CP slicer (slice_log_prob_with_cp), None for nanscope's model.
        slicer_takes_format: the slicer takes (qkv_format, max_token_len) too (v0.2.x).
        rollout_always_read: the loss reads rollout_log_probs whenever the batch has them (a metric
            since v0.2), not only under --use-tis.
    """

    name: str
    module: str
    entry: str
    signatures: Mapping[str, tuple[str, ...]]
    clamps: Mapping[str, str]
    inline_exp: bool
    slicer: str | None
    slicer_takes_format: bool = False
    rollout_always_read: bool = False

    def reads(self, args) -> tuple[str, ...]:
        """The per-token batch keys this release's policy loss reads under `args`, in check order."""
        rollout = self.rollout_always_read or args.use_tis
        return ("log_probs", "advantages") + ("rollout_log_probs",) * rollout + ("ref_log_probs",) * args.use_kl_loss


def _frozen(d: dict) -> Mapping:
    return MappingProxyType(d)


_PPO = ("ppo_kl", "advantages", "eps_clip", "eps_clip_high", "eps_clip_c")
_CUSTOM_LOSS = ("args", "batch", "logits", "sum_of_sample_mean")
_TIS = ("args", "pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "kwargs")
_KL_V1 = ("log_probs", "log_probs_base", "kl_loss_type")
_SLICE = ("log_prob", "total_length", "response_length")

V0_1_0 = Release(
    name=known.BY_KEY[known.V0_1_0].name,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen(
        {
            f"{SLIME_LOSS}.policy_loss_function": _CUSTOM_LOSS,
            f"{SLIME_LOSS}.loss_function": ("args", "batch", "num_microbatches", "logits"),
            f"{SLIME_LOSS}.compute_policy_loss": _PPO,
            f"{SLIME_LOSS}.compute_approx_kl": _KL_V1,
            f"{SLIME_CP}.slice_log_prob_with_cp": _SLICE,
        }
    ),
    clamps=_frozen({"compute_policy_loss": EXP_NEG_FIRST, "compute_approx_kl": EXP_SECOND_MINUS_FIRST}),
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
)

V0_2_4 = Release(
    name=known.BY_KEY[known.V0_2_4].name,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen(
        {
            f"{SLIME_LOSS}.policy_loss_function": _CUSTOM_LOSS,
            f"{SLIME_LOSS}.loss_function": ("args", "batch", "num_microbatches", "logits"),
            f"{SLIME_LOSS}.compute_policy_loss": _PPO,
            f"{SLIME_LOSS}.compute_approx_kl": _KL_V1 + ("importance_ratio",),
            f"{SLIME_LOSS}.vanilla_tis_function": _TIS,
            f"{SLIME_LOSS}.icepop_function": _TIS,
            f"{SLIME_CP}.slice_log_prob_with_cp": _SLICE + ("qkv_format", "max_token_len"),
        }
    ),
    clamps=_frozen({"compute_policy_loss": EXP_NEG_FIRST, "compute_approx_kl": EXP_SECOND_MINUS_FIRST}),
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
    slicer_takes_format=True,
    rollout_always_read=True,
)

_V0_3_SIGNATURES = {
    f"{SLIME_LOSS}.policy_loss_function": _CUSTOM_LOSS,
    f"{SLIME_LOSS}.loss_function": ("args", "batch", "num_microbatches", "step_global_batch_size", "logits"),
    f"{SLIME_LOSS}.compute_policy_loss": _PPO,
    f"{SLIME_LOSS}.compute_cispo_loss": ("ppo_kl", "log_probs", "advantages", "eps_clip", "eps_clip_high"),
    f"{SLIME_LOSS}.compute_approx_kl": _KL_V1 + ("importance_ratio",),
    f"{SLIME_LOSS}.vanilla_tis_function": _TIS,
    f"{SLIME_LOSS}.icepop_function": _TIS,
    f"{SLIME_CP}.slice_log_prob_with_cp": _SLICE,
}
_V0_3_CLAMPS = _frozen(
    {
        "compute_policy_loss": EXP_NEG_FIRST,
        "compute_cispo_loss": EXP_NEG_FIRST,
        "compute_approx_kl": EXP_SECOND_MINUS_FIRST,
    }
)

V0_3_1 = Release(
    name=known.BY_KEY[known.V0_3_1].name,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen(_V0_3_SIGNATURES),
    clamps=_V0_3_CLAMPS,
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
    rollout_always_read=True,
)

# main as of 2026-08-21 (624b824): v0.3.1's loss API plus the train-dump log-prob capture; it also
# passes --eps-clip-c to compute_policy_loss (dual-clip), which the wrapper leaves to slime.
MAIN_2026_08 = Release(
    name=known.BY_KEY[known.MAIN].name,
    module=SLIME_LOSS,
    entry="policy_loss_function",
    signatures=_frozen({**_V0_3_SIGNATURES, f"{SLIME_LOSS}.enable_log_prob_capture": ()}),
    clamps=_V0_3_CLAMPS,
    inline_exp=True,
    slicer=f"{SLIME_CP}.slice_log_prob_with_cp",
    rollout_always_read=True,
)

MODEL = Release(
    name="nanscope's model of slime v0.1.0 (nanscope.loss.as_is; slime is not installed)",
    module=MODEL_LOSS,
    entry="policy_loss",
    signatures=_frozen(
        {
            f"{MODEL_LOSS}.policy_loss": _CUSTOM_LOSS + ("parallel",),
            f"{MODEL_LOSS}.ppo_clip_loss": _PPO,
            f"{MODEL_LOSS}.approx_kl": ("log_ratio", "kl_loss_type"),
            f"{MODEL_LOSS}.tis_weights": ("log_ratio", "tis_clip_low", "tis_clip"),
        }
    ),
    clamps=_frozen({"ppo_clip_loss": EXP_NEG_FIRST, "approx_kl": EXP_NEG_FIRST, "tis_weights": EXP_FIRST}),
    inline_exp=False,
    slicer=None,
)

# Newest first: a release whose API extends an older one's is tried before it.
SLIME_RELEASES: tuple[Release, ...] = (MAIN_2026_08, V0_3_1, V0_2_4, V0_1_0)


@dataclass(frozen=True)
class Target:
    """A release bound to its loaded loss module: what the guard calls and patches."""

    release: Release
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


def mismatches(release: Release) -> list[str]:
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


def identify(candidates: tuple[Release, ...] = SLIME_RELEASES) -> Release:
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


_bound: dict[int, Target] = {}  # id(loss module) -> its checked target


def bind(module: ModuleType, candidates: tuple[Release, ...] = SLIME_RELEASES) -> Target:
    """Identify and check `module` once, then return its Target (cached per module object)."""
    target = _bound.get(id(module))
    if target is None or target.module is not module:
        release = identify(candidates)
        slicer = None
        if release.slicer is not None:
            cp_module, _, name = release.slicer.rpartition(".")
            slicer = getattr(sys.modules[cp_module], name)
        target = _bound[id(module)] = Target(release, module, slicer)
    return target


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
        return bind(importlib.import_module(MODEL_LOSS), (MODEL,))
    return bind(module)
