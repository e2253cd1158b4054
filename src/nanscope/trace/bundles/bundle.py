"""The repro bundle: what a rank saw of a non-finite step, small enough to keep, replayable offline.

On a non-finite step each rank that saw it writes `rollout<R>_step<S>_rank<K>.bundle.pt` (nanscope.slime_plugin).
It loads with torch.load(weights_only=True) and with scan's restricted loader: plain dicts, lists, strings,
numbers, None and dense CPU tensors only.

    {
      "format": "nanscope-bundle/1",
      "nanscope": "0.1.0",                       # the version that wrote it
      "release": {"name": "v0.1.0", "module": "slime.backends.megatron_utils.loss", "log_prob_returns": "dict"},
      "rollout_id": R, "step_id": S,
      "coords": {"rank", "pp", "tp", "cp_rank", "cp_size", "dp_rank", "dp_size", "last_stage"},
      "args": {field: value},                    # every plain-typed field of slime's args (the loss reads a subset)
      "report": {...},                           # the sentinel's reading and class, as the .json report has them
      "microbatches": [
        {
          "index": i,                            # 0-based, the step's loss calls on this rank, in order
          "microbatch": m,                       # the forward micro-batch it belongs to (the sentinel's numbering)
          "parallel": {"cp_rank", "cp_size"},    # the CP coordinate the loss call ran at
          "why": ["sentinel-forward" | "sentinel-backward" | "nonfinite-input" | "nonfinite-loss"],
          "batch": {key: [per sample ...] or value},   # what slime's policy loss received, but the logits:
                                                 # unconcat_tokens, total_lengths, response_lengths, loss_masks,
                                                 # log_probs, ref_log_probs, rollout_log_probs, advantages, and each
                                                 # release's own keys (max_seq_lens, rollout_mask_sums, ...)
          "current": {"log_probs": [float32 [n_i], ...], "entropy": [...]} | None,
                                                 # the current policy's, as the release's helper computed them
                                                 # from the logits (this CP rank's tokens); None: not kept, the
                                                 # replay falls back to the old-policy log_probs (approximate)
          "loss": {"value": float, "finite": bool} | None,
          "rows": [dump row of each sample] | None,   # nanscope.slime_plugin.rows: from the data partition
          "rows_how": "how the rows were derived, or why they could not be",
        },
      ],
      "skipped_keys": [batch keys not kept: not plain data],
    }
"""

from __future__ import annotations

import torch

from nanscope.facts.paths import BUNDLE_SUFFIX

FORMAT = "nanscope-bundle/1"
SUFFIX = BUNDLE_SUFFIX
WHY = ("sentinel-forward", "sentinel-backward", "nonfinite-input", "nonfinite-loss")
_PLAIN = (bool, int, float, str, type(None))


def plain(value):
    """`value` as plain data the restricted loaders read (tensors detached on the CPU), or None if it is not."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_meta:
            return None
        return value.detach().cpu().contiguous().clone()
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        items = [plain(v) for v in value]
        return None if any(i is None and v is not None for i, v in zip(items, value)) else items
    return None


def plain_args(args) -> dict:
    """Every field of slime's args namespace with a plain value (numbers, strings, booleans, None)."""
    fields = vars(args) if not isinstance(args, dict) else args
    return {k: v for k, v in fields.items() if isinstance(v, _PLAIN) and isinstance(k, str)}


def plain_batch(batch: dict) -> tuple[dict, list[str]]:
    """(the batch's plain entries, the names of those that are not plain: packed_seq_params and the like)."""
    kept, skipped = {}, []
    for key, value in batch.items():
        converted = plain(value)
        if converted is None and value is not None:
            skipped.append(key)
        else:
            kept[key] = converted
    return kept, sorted(skipped)


def split(flat: torch.Tensor | None, sizes: list[int]) -> list[torch.Tensor] | None:
    """A concatenated [N] per-token tensor as per-sample CPU tensors of `sizes`."""
    if flat is None:
        return None
    return [t.clone() for t in flat.detach().cpu().split(sizes)]
