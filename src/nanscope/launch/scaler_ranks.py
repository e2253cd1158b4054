"""Whose rank a DeepSpeed overflow line names: `[deepspeed] OVERFLOW! Rank 0 Skipping step` is logged by rank 0 for
every rank (DeepSpeed 0.16.4 deepspeed/runtime/fp16/loss_scaler.py:180-188, rank 0 only), while a line naming another
rank was printed by that rank itself (ZeRO stage 2's `fp16 dynamic loss scale overflow! Rank 6 Skipping step`, on
ranks 6, 4, 1, ... at one time stamp: THUDM/GLM#32, holdout17 10).

    logging_rank("0")   # 'rank 0 logs it (DeepSpeed prints it on rank 0 only)'
"""

from __future__ import annotations


def logging_rank(rank: str) -> str:
    """What the line's `Rank N` says about who logged it."""
    if int(rank) == 0:
        return "rank 0 logs it (DeepSpeed prints it on rank 0 only)"
    return f"rank {int(rank)} logs it (its own overflow: a line naming a rank other than 0 is printed by that rank)"
