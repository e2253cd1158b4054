"""Whose rank a DeepSpeed overflow line names. `[deepspeed] OVERFLOW! Rank 0 Skipping step` is logged by rank 0 for
every rank (DeepSpeed 0.16.4 deepspeed/runtime/fp16/loss_scaler.py:180-188, rank 0 only); ZeRO stage 2's
`fp16 dynamic loss scale overflow! Rank 6 Skipping step` is printed by each rank that overflowed (ranks 6, 4, 1, ...
at one time stamp: THUDM/GLM#32, holdout17 10), so its rank is that rank's own, rank 0's included.

    logging_rank("0", every_rank=False)   # 'rank 0 logs it (DeepSpeed prints it on rank 0 only)'
"""

from __future__ import annotations


def logging_rank(rank: str, *, every_rank: bool) -> str:
    """What the line's `Rank N` says about who logged it (`every_rank`: a wording every rank prints)."""
    if int(rank) == 0 and not every_rank:
        return "rank 0 logs it (DeepSpeed prints it on rank 0 only)"
    return f"rank {int(rank)} logs it (its own overflow: this line is printed by each rank that overflowed)"
