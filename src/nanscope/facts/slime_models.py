"""slime's own model-args files, as data: the MoE flag values doctor assumes when a launch sources one it cannot read.

A launch script usually sources its model's flags (`source scripts/models/qwen3-235B-A22B.sh`); the case's sources a
file that was never shared. doctor then says which flags would decide each MoE cause and evaluates them once more
with the values of slime's own file for that model, marked as assumed. Only the values are bundled, each with the
line of the file it comes from (the file itself is not); tests/slime_releases checks them against a checkout.

    from nanscope.facts.slime_models import matching
    matching("scripts/slime_models/Qwen3-235B-A22B-Thinking-2507_model_args.sh").path
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nanscope.facts.releases import V0_1_0


@dataclass(frozen=True)
class ModelArgs:
    """The MoE flags of one of slime's model-args files.

    Attributes:
        model: the model's name as slime spells the file (`scripts/models/<model>.sh`).
        release: the slime release whose file it is.
        flags: (flag, its words, line) in file order; a store_true flag has no words.
    """

    model: str
    release: str
    flags: tuple[tuple[str, tuple[str, ...], int], ...]

    @property
    def path(self) -> str:
        return f"scripts/models/{self.model}.sh"

    def argv(self) -> list[str]:
        """The flags as the train command receives them."""
        return [word for flag, words, _ in self.flags for word in (flag, *words)]

    def line(self, flag: str) -> int | None:
        """The line of `flag` in the file, or None when the file does not set it."""
        return next((line for name, _, line in self.flags if name == flag), None)


QWEN3_235B_A22B = ModelArgs(
    "qwen3-235B-A22B",
    V0_1_0,
    (
        ("--moe-router-score-function", ("softmax",), 25),
        ("--moe-token-dispatcher-type", ("alltoall",), 26),
        ("--moe-router-topk", ("8",), 27),
        ("--num-experts", ("128",), 29),
        ("--moe-grouped-gemm", (), 30),
        ("--moe-router-dtype", ("fp32",), 32),
        ("--moe-permute-fusion", (), 33),
        ("--moe-aux-loss-coeff", ("0",), 34),
    ),
)
MODEL_ARGS = (QWEN3_235B_A22B,)


def matching(sourced: str) -> ModelArgs | None:
    """slime's file for the model a sourced file's name names (its case and `-`/`_`/`.` ignored), if nanscope has it.

    `scripts/slime_models/Qwen3-235B-A22B-Thinking-2507_model_args.sh` names qwen3-235B-A22B (the Thinking-2507
    checkpoint shares its architecture).
    """
    name = _folded(os.path.basename(sourced))
    return next((args for args in MODEL_ARGS if _folded(args.model) in name), None)


def _folded(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())
