"""A rollout dump's samples converted, one `Sample.to_dict()` dict at a time, into `SampleData`.

slime's rollout dump (`--save-debug-rollout-data .../{rollout_id}.pt`, slime/ray/buffer.py) is
`dict(rollout_id=int, samples=[Sample.to_dict(), ...])`: plain Python values, `tokens` prompt + response
(the response is the last `response_length` tokens). A sample converts two ways: for the checks
(`scan_sample`: lengths, loss mask, reward, rollout log-probs) or for a token map (`token_sample`: the
token ids, response length and loss mask; no reward, which the harness's own dumps do not write).
"""

from __future__ import annotations

from nanscope.dumps.dump import SampleData
from nanscope.dumps.fields import Fields
from nanscope.dumps.limits import SAMPLE_COST
from nanscope.errors import UserError


def scan_sample(fields: Fields, sample: dict, i: int, reward_key: str | None) -> SampleData:
    """What the checks read of sample `i`: its lengths, loss mask, reward (after --reward-key) and rollout log-probs."""
    _require(fields, sample, i, ("tokens", "response_length", "reward"))
    fields.budget.take(SAMPLE_COST, "sample", i)
    tokens_length = fields.length(sample["tokens"], "tokens", i)
    response_length = fields.response_length(sample["response_length"], "response_length", i)
    lengths = {"tokens": tokens_length, "response_length": response_length}
    mask = sample.get("loss_mask")
    if mask is None:  # slime: "always instantiate loss_mask if not provided"
        loss_mask = fields.default_mask(response_length, tokens_length, "loss_mask", i)
    else:
        loss_mask = fields.mask(mask, "loss_mask", i)
        lengths["loss_mask"] = len(loss_mask)
    stored_logp = sample.get("rollout_log_probs")
    rollout_logp = None if stored_logp is None else fields.floats(stored_logp, "rollout_log_probs", i)
    if rollout_logp is not None:
        lengths["rollout_log_probs"] = len(rollout_logp)
    return SampleData(
        sample=i,
        prompt_length=tokens_length - response_length,
        response_length=response_length,
        tokens_length=tokens_length,
        loss_mask=loss_mask,
        reward=fields.reward(sample["reward"], i, reward_key),
        rollout_log_probs=rollout_logp,
        lengths=lengths,
    )


def token_sample(fields: Fields, sample: dict, i: int) -> SampleData:
    """What a token map reads of sample `i`: its token ids (int64), response length and loss mask, which
    must agree (the map places each response token in the sequence)."""
    _require(fields, sample, i, ("tokens", "response_length"))
    fields.budget.take(SAMPLE_COST, "sample", i)
    tokens = fields.token_ids(sample["tokens"], "tokens", i)
    response_length = fields.response_length(sample["response_length"], "response_length", i)
    if response_length > len(tokens):
        raise UserError(f"{fields.path}: response_length of sample {i}: {response_length} > len(tokens) {len(tokens)}")
    mask = sample.get("loss_mask")
    if mask is None:  # slime: "always instantiate loss_mask if not provided"
        loss_mask = fields.default_mask(response_length, len(tokens), "loss_mask", i)
    else:
        loss_mask = fields.mask(mask, "loss_mask", i)
    if len(loss_mask) != response_length:
        raise UserError(
            f"{fields.path}: loss_mask of sample {i}: length {len(loss_mask)} != response_length {response_length}"
        )
    return SampleData(
        sample=i,
        prompt_length=len(tokens) - response_length,
        response_length=response_length,
        tokens_length=len(tokens),
        loss_mask=loss_mask,
        tokens=tokens,
    )


def _require(fields: Fields, sample: dict, i: int, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in sample:
            raise UserError(f"{fields.path}: sample {i}: missing field '{key}' (not a Sample.to_dict())")
