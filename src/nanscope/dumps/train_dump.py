"""A train dump's samples converted into `SampleData`: v0.1.0 to v0.3.1's per-key lists, or main's per-sample dicts.

slime's train dump (`--save-debug-train-data .../{rollout_id}_{rank}.pt`, megatron_utils/actor.py) is
`dict(rollout_id=int, rank=int, rollout_data=dict)`, written AFTER the optimizer step (so a step that
crashes never writes one). `rollout_data` holds this rank's data-parallel share as per-key lists: tokens
(long tensors), total_lengths, response_lengths, rewards (already GRPO-normalised), truncated, loss_masks
(int tensors), sample_indices, rollout_log_probs (bf16 tensors), and on the last pipeline stage
log_probs, ref_log_probs, advantages, returns (fp32 tensors); `raw_reward` covers the whole rollout.
Under context parallelism (cp > 1) the per-token tensors log_probs, ref_log_probs, rollout_log_probs and
advantages hold only this CP rank's two zigzag chunks of the response; tokens and loss_masks stay whole.
v0.2.4 and v0.3.1 keep this layout (rollout_log_probs float32, more keys); main writes
`dict(format_version=2, rollout_id, rank, samples=[one dict of those keys per sample], ...)` with the
CP-sliced fields gathered back to whole responses, read like a rollout dump's samples (`main_sample`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nanscope.dumps import formats
from nanscope.dumps.dump import Dump, SampleData
from nanscope.dumps.fields import SEQUENCES, Fields, brief, entry, is_tensor, stored_rollout_id, type_name
from nanscope.dumps.limits import SAMPLE_COST
from nanscope.errors import UserError
from nanscope.facts.keys import DUMP_PER_TOKEN, TRAIN_DUMP_PER_SAMPLE
from nanscope.loss.layout import response_positions


def is_main_sample(sample: Any) -> bool:
    """A sample of main's train dump (format_version 2): train keys (response_lengths), not Sample fields."""
    return isinstance(sample, dict) and "response_lengths" in sample and "response_length" not in sample


def main_sample(fields: Fields, sample: dict, i: int) -> SampleData:
    """Sample `i` of main's train dump: its train keys, CP fields already whole."""
    row = {k: sample[k] for k in TRAIN_DUMP_PER_SAMPLE if sample.get(k) is not None}
    return _train_sample(fields, row, i, 1, 0)


def train_dump(fields: Fields, obj: dict, cp_size: int, tp_size: int) -> Dump:
    """A Dump over a v0.1.0 to v0.3.1 train dump's `rollout_data` (the whole object, loaded)."""
    path, data = fields.path, obj["rollout_data"]
    if not isinstance(data, dict):
        raise UserError(f"{path}: rollout_data: expected a dict of per-key lists, got {type_name(data)}")
    for key in ("tokens", "response_lengths"):
        if key not in data:
            raise UserError(f"{path}: rollout_data: missing key '{key}' (not a slime v0.1.0 train dump)")
    present = [k for k in TRAIN_DUMP_PER_SAMPLE if k in data and data[k] is not None]
    for k in present:
        if not isinstance(data[k], SEQUENCES):
            raise UserError(f"{path}: rollout_data['{k}']: expected a per-sample list, got {type_name(data[k])}")
    n = len(data["tokens"])
    for k in present:
        if len(data[k]) != n:
            raise UserError(f"{path}: rollout_data['{k}']: {len(data[k])} entries, but tokens has {n} samples")
    rank = obj.get("rank")
    if cp_size > 1 and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise UserError(f"{path}: rank: {brief(rank)}; needed to find the CP rank with --context-parallel-size")
    cp_rank = (rank // tp_size) % cp_size if cp_size > 1 else 0
    rows = (_train_sample(fields, {k: entry(data[k], i) for k in present}, i, cp_size, cp_rank) for i in range(n))
    rollout_logp = data.get("rollout_log_probs")
    first = entry(rollout_logp, 0) if rollout_logp else None
    dtype = str(first.dtype).removeprefix("torch.") if is_tensor(first) else None
    return Dump(
        path=path,
        kind="train",
        rollout_id=stored_rollout_id(obj.get("rollout_id")),
        rank=rank if isinstance(rank, int) else None,
        cp_size=cp_size,
        format=formats.train(list(data), dtype),
        _rows=rows,
        _total=n,
    )


def _train_sample(fields: Fields, row: dict, i: int, cp_size: int, cp_rank: int) -> SampleData:
    fields.budget.take(SAMPLE_COST, "sample", i)
    tokens_length = fields.length(row["tokens"], "tokens", i)
    response_length = fields.response_length(row["response_lengths"], "response_lengths", i)
    lengths = {"tokens": tokens_length, "response_length": response_length}
    if "total_lengths" in row:
        lengths["total_lengths"] = fields.int(row["total_lengths"], "total_lengths", i)
    if "loss_masks" in row:
        mask = fields.mask(row["loss_masks"], "loss_masks", i)
        lengths["loss_mask"] = len(mask)
    else:
        mask = fields.default_mask(response_length, tokens_length, "loss_masks", i)
    out = SampleData(
        sample=i,
        prompt_length=tokens_length - response_length,
        response_length=response_length,
        tokens_length=tokens_length,
        loss_mask=mask,
        lengths=lengths,
    )
    if "rewards" in row:
        out.reward = fields.reward(row["rewards"], i, None)
    for key in DUMP_PER_TOKEN:
        if key in row:
            values = fields.floats(row[key], key, i)
            setattr(out, key, values)
            lengths[key] = len(values)
    if cp_size > 1 and 0 < response_length <= tokens_length:
        fields.budget.take(tokens_length, "tokens", i)
        out.positions = cp_response_positions(tokens_length, response_length, cp_size, cp_rank)
    return out


def cp_response_positions(total_length: int, response_length: int, cp_size: int, cp_rank: int) -> np.ndarray:
    """Response positions (0-based) of one CP rank's per-token entries, in the rank's order.

    Returns:
        int64 [local_len], from `nanscope.loss.layout.response_positions` (slime v0.1.0's zigzag).
    """
    return np.asarray(response_positions(total_length, response_length, cp_rank, cp_size), dtype=np.int64)
