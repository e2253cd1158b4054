"""The per-rollout check: slime's GRPO group normalisation of the rewards, run once after every sample.

A non-finite reward, or a group whose normalisation is non-finite (torch.std of a group of one sample is
nan), makes the whole group's advantages NaN.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from nanscope.causes import catalogue
from nanscope.dumps.collector import Collector
from nanscope.dumps.flags import ScanFlags


@dataclass
class RolloutView:
    """What the rollout-level checks read: every sample's reward (nan where a sample has none)."""

    path: str
    rewards: list[float]
    flags: ScanFlags
    collector: Collector


def check_groups(rollout: RolloutView) -> None:
    """Run slime v0.1.0's group normalisation (post_process_rewards) and flag non-finite outputs."""
    import torch  # heavy: torch, the normalisation is slime's own torch code

    from nanscope.loss.formulas import grpo_normalize  # heavy: torch

    flags, collector, rewards = rollout.flags, rollout.collector, rollout.rewards
    if not rewards:
        return
    n = flags.n_samples_per_prompt
    if len(rewards) % n:
        collector.errors.append(
            f"{rollout.path}: samples: {len(rewards)} samples do not form groups of --n-samples-per-prompt {n} "
            f"({len(rewards)} % {n} = {len(rewards) % n}): slime v0.1.0's reshape(-1, {n}) fails"
        )
        return
    std = flags.grpo_std_normalization and flags.advantage_estimator in ("grpo", "gspo")
    # torch.std of a single element is nan (unbiased): a group of 1 is all-nan by itself.
    with warnings.catch_warnings():  # torch warns on the std of one element; that nan is the point
        warnings.simplefilter("ignore")
        normalised = grpo_normalize(torch.tensor(rewards, dtype=torch.float32), n, std).numpy()
    for group in np.flatnonzero(~np.isfinite(normalised.reshape(-1, n)).all(axis=1)).tolist():
        lo, hi = group * n, (group + 1) * n
        bad = [i for i in range(lo, hi) if not math.isfinite(rewards[i])]
        if bad:
            why = f"sample {bad[0]}'s reward is {rewards[bad[0]]}"
        elif n == 1 and std:
            why = "group of 1: std of one element is nan"
        else:
            why = "rewards overflow float32"
        for i in range(lo, hi):
            if not math.isfinite(normalised[i]):
                collector.sample_level(
                    "grpo-nonfinite", i, catalogue.NAN_REWARD.name, float(normalised[i]), f"group {group}: {why}"
                )
