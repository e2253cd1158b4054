"""A rank's mini-batch for verl's update_actor, and what a test plants in it on rank 1.

4 samples a rank, 4 prompt and 6 response tokens: sample 1 has a padded tail (its last 2 tokens), sample 2 a masked
token in the response (position 3, response_mask 0, as a tool's output is); ref_log_prob is there for runs with
use_kl_loss, and values and returns for the critic (drawn last, so the other fields are those of a batch without
them). Values drawn from a generator seeded by
(step, rank), so a run is reproducible and two runs with the same plants see the same data.

PLANTS (on rank 1 only; the test names the step):
    old_log_prob_nan_trained   NaN in sample 0's old_log_probs at response position 2, a trained token
    old_log_prob_masked        that token masked instead (response_mask 0): what A's plugin run must equal
    log_ratio_95_masked        sample 2's masked token gets old_log_prob -100: log-ratio ~95 > 88.72 (exp overflows)
    advantage_nan_masked       NaN in sample 2's advantages at that masked token
    ref_log_prob_nan_masked    NaN in sample 2's ref_log_prob at that masked token (the KL term's input)
"""

from __future__ import annotations

import torch

SAMPLES, PROMPT, RESPONSE, VOCAB = 4, 4, 6, 128
PLANTS = (
    "old_log_prob_nan_trained", "old_log_prob_masked", "log_ratio_95_masked", "advantage_nan_masked",
    "ref_log_prob_nan_masked",
)  # fmt: skip
TRAINED = (0, 2)  # (sample, response position) of old_log_prob_nan_trained
MASKED = (2, 3)  # (sample, response position) of the masked token


def mini_batch(rank: int, step: int, plant: str | None):
    """The TensorDict verl's trainer hands update_actor (no padding, trainer_base.py:1692-1703's extra info)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    assert plant is None or plant in PLANTS, plant
    g = torch.Generator().manual_seed(1000 + 10 * step + rank)
    ids = torch.randint(0, VOCAB, (SAMPLES, PROMPT + RESPONSE), generator=g)
    attention = torch.ones(SAMPLES, PROMPT + RESPONSE, dtype=torch.int64)
    attention[1, -2:] = 0
    mask = attention[:, PROMPT:].clone()
    mask[MASKED] = 0
    old = -torch.rand(SAMPLES, RESPONSE, generator=g) * 4 - 1
    advantages = torch.randn(SAMPLES, 1, generator=g).expand(SAMPLES, RESPONSE).clone()
    ref = -torch.rand(SAMPLES, RESPONSE, generator=g) * 4 - 1
    values = torch.randn(SAMPLES, RESPONSE, generator=g)
    returns = values + 0.3 * torch.randn(SAMPLES, RESPONSE, generator=g)
    if rank == 1 and plant == "old_log_prob_nan_trained":
        old[TRAINED] = float("nan")
    elif rank == 1 and plant == "old_log_prob_masked":
        mask[TRAINED] = 0
    elif rank == 1 and plant == "log_ratio_95_masked":
        old[MASKED] = -100.0
    elif rank == 1 and plant == "advantage_nan_masked":
        advantages[MASKED] = float("nan")
    elif rank == 1 and plant == "ref_log_prob_nan_masked":
        ref[MASKED] = float("nan")
    fields = {
        "input_ids": ids, "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "prompts": ids[:, :PROMPT], "responses": ids[:, PROMPT:], "response_mask": mask, "old_log_probs": old,
        "advantages": advantages, "ref_log_prob": ref, "values": values, "returns": returns,
    }  # fmt: skip
    td = left_right_2_no_padding(TensorDict(fields, batch_size=[SAMPLES]))
    tu.assign_non_tensor(
        td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
        global_batch_size=2 * SAMPLES, mini_batch_size=2 * SAMPLES, epochs=1, seed=42,
        dataloader_kwargs={"shuffle": False}, temperature=1.0, compute_loss=True, multi_turn=False,
    )  # fmt: skip
    return td
