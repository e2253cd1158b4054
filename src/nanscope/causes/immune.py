"""Causes that real RL runs hit but slime cannot: the catalogue records them, with the lines that show it.

They are immune in every release nanscope knows (the same rules hold at other lines in v0.2.4, v0.3.1 and
main); doctor's differential lists them as ruled out.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.causes.classes import DATA, LOSS_NUMERICS, OPTIMIZER
from nanscope.facts.megatron import MCORE
from nanscope.facts.releases import SLIME_V0_1_0


@dataclass(frozen=True)
class Immune:
    """A cause that real RL runs hit but slime v0.1.0 cannot: the catalogue says so instead of inventing a hazard.

    Attributes:
        name: kebab-case id (doctor's candidates use it).
        cause: what would go wrong, in words.
        why: why slime v0.1.0 is immune.
        evidence: "file:line (release)" that shows it, at slime v0.1.0 or megatron-core 0.15.0rc0.
        cause_class: the class it would have (causes.classes.CLASSES).
    """

    name: str
    cause: str
    why: str
    evidence: tuple[str, ...]
    cause_class: str


IMMUNE: tuple[Immune, ...] = (
    Immune(
        "singleton-group",
        "a GRPO group of one sample (--n-samples-per-prompt 1): the unbiased std of one value is NaN",
        "slime turns GRPO std normalisation off when n-samples-per-prompt is 1, and reshapes the rewards into "
        "groups of exactly n-samples-per-prompt, so a group of one never meets std() (the same rule holds in "
        "v0.2.4 and v0.3.1)",
        (f"slime/utils/arguments.py:996 ({SLIME_V0_1_0})", f"slime/ray/buffer.py:93 ({SLIME_V0_1_0})"),
        DATA,
    ),
    Immune(
        "zero-std-group",
        "a group whose rewards are all equal: std 0 divides the centred rewards",
        "slime divides by std + 1e-6, and the centred rewards are exactly 0: advantages 0, finite",
        (f"slime/ray/buffer.py:99 ({SLIME_V0_1_0})",),
        DATA,
    ),
    Immune(
        "empty-loss-mask",
        "a sample whose loss mask is all zero (a response of tool output only): a per-sample mean of 0 / 0",
        "slime divides each sample's masked sum by clamp_min(loss_mask.sum(), 1)",
        (
            f"slime/backends/megatron_utils/cp_utils.py:60 ({SLIME_V0_1_0})",
            f"slime/backends/megatron_utils/cp_utils.py:86 ({SLIME_V0_1_0})",
        ),
        LOSS_NUMERICS,
    ),
    Immune(
        "inf-grad-clip",
        "an inf gradient that gradient clipping turns into NaN parameters (clip coefficient max_norm / inf = 0, "
        "0 x inf = NaN)",
        "with --check-for-nan-in-loss-and-grad (the default) megatron's DDP rejects an inf bucket norm before the "
        "optimizer (the job dies with 'found Inf in local grad norm'); without it slime skips a step whose grad "
        "norm is NaN or inf",
        (
            f"megatron/core/distributed/param_and_grad_buffer.py:195 ({MCORE})",
            f"slime/backends/megatron_utils/model.py:322 ({SLIME_V0_1_0})",
        ),
        OPTIMIZER,
    ),
)
