"""A mini-batch's non-finite loss inputs, cleaned before verl counts its tokens: values replaced, tokens dropped.

verl's engine takes the mini-batch's token count for the loss normalisation from `loss_mask` at the start of
`forward_backward_batch` (verl v0.9.0 verl/workers/engine/fsdp/transformer_impl.py:705-710, all-reduced over
data parallelism), and the policy loss masks with `response_mask` (verl/workers/utils/losses.py:93). The
engine's `train_batch` cleans the mini-batch first, so a token whose input is non-finite leaves both masks
before the count: the step then equals, bit for bit, one whose data had that token masked (a loss guard alone
could mask it, but not take it out of a count already all-reduced). Replacing the value matters too: masking
alone leaves NaN * 0 in the backward pass (shared/research/verl-plugin.md §1: a NaN advantage at a masked
token makes the gradient NaN).

The KL term (use_kl_loss) is computed in ppo_loss itself, outside any policy loss mode (losses.py:132-141:
kl_penalty(log_prob, ref_log_prob) then agg_loss), so this is where it is guarded: ref_log_prob's non-finite
entries are replaced and dropped as above (a NaN ref_log_prob at a masked token under k2 otherwise makes the
gradient NaN: 0.5 * (log_prob - NaN)^2's derivative is NaN, times the mask's zero), and its entries at every
masked token become 0 (`padded.selected`), so a finite but huge masked value cannot make kl_penalty inf there,
which seq-mean-* aggregation multiplies by the mask (core_algos.py:1182,1196: inf * 0 = NaN). verl clamps the
exponent of low_var_kl/k3 itself (core_algos.py:2238-2244), so no clamp is added.

    KEYS        the per-token inputs of verl's losses, cleaned where present: old_log_probs, advantages,
                ref_log_prob (use_kl_loss), rollout_log_probs, rollout_is_weights (rollout correction)
    SELECTED    the keys whose masked entries become 0 as well: ref_log_prob (the KL term's)
    COUNTERS    what `clean` counts, as the step's nanscope/nan_guard/* (step_vote.Counters): non-finite entries
                per key (masked ones too), exp_overflow (tokens whose log_prob - old exceeded 88.72, counted by
                the `nanscope` loss mode, which clamps them), dropped_tokens (trained tokens cleaning took out)

Tensors may be dense [B, T] (verl's ppo data: left_right_2_no_padding keeps response_mask dense and aliases
loss_mask to it, verl/workers/utils/padding.py:71) or jagged nested tensors; a key whose shape differs from
response_mask's is cleaned but drops no token. No host sync: every count stays on the device.
"""

from __future__ import annotations

import torch

from nanscope.loss import padded

KEYS = ("old_log_probs", "advantages", "ref_log_prob", "rollout_log_probs", "rollout_is_weights")
COUNTERS = tuple(f"nan_guard/{k}" for k in KEYS) + ("nan_guard/exp_overflow", "nan_guard/dropped_tokens")
MASKS = ("response_mask", "loss_mask")
SELECTED = ("ref_log_prob",)


def clean(data) -> torch.Tensor:
    """Clean `data` (a TensorDict, changed in place) and return its counts: [len(COUNTERS)] float32 on its device,
    exp_overflow 0 (the loss mode counts it later). Every KEYS entry finite afterwards, the tokens of non-finite ones
    out of both masks, the SELECTED keys 0 wherever the mask is 0. A mini-batch without response_mask (not a policy
    loss's) is left as it is: zeros."""
    if "response_mask" not in data.keys():
        return torch.zeros(len(COUNTERS))
    mask = data["response_mask"]
    shape = _values(mask).shape
    device = _values(mask).device
    drop = torch.zeros(shape, dtype=torch.bool, device=device)
    counts = []
    for key in KEYS:
        if key not in data.keys():
            counts.append(torch.zeros((), device=device))
            continue
        tensor = data[key]
        values, finite = padded.cleaned(_values(tensor))
        data[key] = _rebuilt(tensor, values)
        counts.append((~finite).sum().float().to(device))
        if finite.shape == shape:
            drop = drop | ~finite.to(device)
    trained = _values(mask) != 0
    for name in MASKS:
        if name in data.keys() and _values(data[name]).shape == shape:
            data[name] = _rebuilt(data[name], padded.masked_out(_values(data[name]), drop))
    kept = trained & ~drop
    for key in SELECTED:
        if key in data.keys() and _values(data[key]).shape == shape:
            data[key] = _rebuilt(data[key], padded.selected(_values(data[key]), kept.to(_values(data[key]).device)))
    counts.append(torch.zeros((), device=device))  # exp_overflow: the loss mode's
    counts.append((drop & trained).sum().float())
    return torch.stack(counts)


def nonfinite_entries(counts: torch.Tensor) -> torch.Tensor:
    """0-dim: the non-finite input entries among `clean`'s counts (the vote's nonfinite_inputs)."""
    return counts[: len(KEYS)].sum()


def _values(t: torch.Tensor) -> torch.Tensor:
    return t.values() if t.is_nested else t


def _rebuilt(like: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`values` in `like`'s layout: a jagged nested tensor over the same offsets, or `values` itself."""
    if not like.is_nested:
        return values
    return torch.nested.nested_tensor_from_jagged(values, offsets=like.offsets())
