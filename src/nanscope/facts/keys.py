"""The names of slime's batch keys, each tuple once.

SAMPLE       per sample of a micro-batch: the tokens and lengths every loss reads
PER_TOKEN    per response token of a micro-batch (this CP rank's share): the loss's inputs
DUMP_PER_TOKEN  the same keys in the order a dump is checked in (a rollout dump holds only the first)
TRAIN_DUMP_PER_SAMPLE  the keys of a train dump's rollout_data with one entry per sample of the rank
"""

from __future__ import annotations

SAMPLE = ("unconcat_tokens", "total_lengths", "response_lengths", "loss_masks")
PER_TOKEN = ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages")
DUMP_PER_TOKEN = ("rollout_log_probs", "log_probs", "ref_log_probs", "advantages")
TRAIN_DUMP_PER_SAMPLE = (
    "tokens",
    "total_lengths",
    "response_lengths",
    "rewards",
    "truncated",
    "loss_masks",
    "sample_indices",
    "rollout_log_probs",
    "log_probs",
    "ref_log_probs",
    "advantages",
    "returns",
)
