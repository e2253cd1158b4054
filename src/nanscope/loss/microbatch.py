"""Plumbing shared by `as_is` and `safe`: parallel context, response rows, masks, loss scaling.

A slime micro-batch (`batch`) is a dict with, per sample i:
    unconcat_tokens[i]   int64 [total_i]     the whole sequence (prompt + response)
    total_lengths[i]     int
    response_lengths[i]  int
    loss_masks[i]        [response_i]        the whole response's mask (1 = trained, 0 = tool output)
    log_probs[i], ref_log_probs[i], rollout_log_probs[i], advantages[i]
                         float32 [n_i]       this CP rank's response tokens (all of them when cp=1)
The model's output `logits` is [1, T_local, V_local] float32: the micro-batch packed into one row
(see `layout`), this rank's vocabulary shard.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from nanscope.facts.keys import PER_TOKEN
from nanscope.loss import devices, layout
from nanscope.loss.formulas import entropy, log_probs, sum_of_sample_mean


@dataclass(frozen=True)
class Parallel:
    """The parallel coordinates the loss needs. Defaults: a single process."""

    tp_group: object | None = None
    cp_rank: int = 0
    cp_size: int = 1
    dp_cp_size: int = 1  # data-parallel world size including context parallelism

    @classmethod
    def from_megatron(cls) -> Parallel:
        """Read megatron-core's parallel state when it is initialised, else a single process.

        Looks in sys.modules rather than importing megatron: if it was never imported, its parallel
        state cannot be initialised, and the import alone costs seconds.
        """
        ps = sys.modules.get("megatron.core.parallel_state")
        if ps is None or not ps.model_parallel_is_initialized():
            return cls()
        return cls(
            tp_group=ps.get_tensor_model_parallel_group(),
            cp_rank=ps.get_context_parallel_rank(),
            cp_size=ps.get_context_parallel_world_size(),
            dp_cp_size=ps.get_data_parallel_world_size(with_context_parallel=True),
        )


def response_rows(logits: torch.Tensor, batch: dict, par: Parallel) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the logit rows that predict each local response token.

    Args:
        logits: [1, T_local, V_local] float32 (temperature already applied or not: rows are copied as is).
        batch: a slime micro-batch.
        par: parallel coordinates.

    Returns:
        (rows [N, V_local], tokens [N] int64) on the logits' device: N local response tokens, samples concatenated
        in order. The row index is built on the host from the lengths and reaches the device in one pinned copy
        (`devices.to_device`); index_select's backward is one scatter into one gradient the size of the logits.
    """
    index, tokens, base = [], [], 0
    for seq, total, response in zip(batch["unconcat_tokens"], batch["total_lengths"], batch["response_lengths"]):
        prompt = total - response
        for s in layout.segments(total, response, par.cp_rank, par.cp_size):
            index.append(torch.arange(base + s.logit_start, base + s.logit_start + s.length))
            tokens.append(seq[prompt + s.response_start : prompt + s.response_start + s.length])  # a view
        base += layout.local_length(total, par.cp_size)
    # slime pads the packed row (to a multiple of 128); padding after the last sample is ignored.
    assert base <= logits.size(1), f"packed length {logits.size(1)} < sum of local sample lengths {base}"
    index = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
    tokens = torch.cat(tokens).long() if tokens else torch.zeros(0, dtype=torch.long)
    device = logits.device
    return logits[0].index_select(0, devices.to_device(index, device)), devices.to_device(tokens, device)


def log_probs_and_entropy(
    logits: torch.Tensor, batch: dict, temperature: float, par: Parallel, with_entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's log-prob and entropy of every local response token.

    Args:
        logits: [1, T_local, V_local] float32 model output.
        batch: slime micro-batch.
        temperature: args.rollout_temperature (logits are divided by it, as slime does).
        par: parallel coordinates (the TP group reduces over the vocabulary shards).
        with_entropy_grad: False computes the entropy outside the autograd graph.

    Returns:
        (logp [N], entropy [N]) float32.
    """
    assert logits.dim() == 3 and logits.size(0) == 1, f"expected [1, T, V] logits, got {tuple(logits.shape)}"
    assert logits.dtype == torch.float32, f"expected float32 logits, got {logits.dtype}"
    rows, tokens = response_rows(logits.div(temperature), batch, par)
    logp = log_probs(rows, tokens, par.tp_group)
    with torch.set_grad_enabled(with_entropy_grad and torch.is_grad_enabled()):
        ent = entropy(rows, par.tp_group)
    return logp, ent


def local_masks(batch: dict, par: Parallel) -> list[torch.Tensor]:
    """Per sample, the loss mask of this CP rank's response tokens, float32 [n_i], on the mask's device.

    Cut with slices of the rank's segments (a view with one CP rank), never indexed with a list of positions
    (which would copy an index to the device and wait for it, one sample at a time).
    """
    out = []
    for mask, total, response in zip(batch["loss_masks"], batch["total_lengths"], batch["response_lengths"]):
        mask = torch.as_tensor(mask).float()
        assert mask.numel() == response, f"loss mask has {mask.numel()} entries, response has {response} tokens"
        parts = [
            mask[s.response_start : s.response_start + s.length]
            for s in layout.segments(total, response, par.cp_rank, par.cp_size)
        ]
        out.append(parts[0] if len(parts) == 1 else torch.cat(parts) if parts else mask[:0])
    return out


def denominators(batch: dict, per_token: bool) -> list[torch.Tensor]:
    """Per sample: clamp_min(whole loss-mask sum, 1) for the per-sample mean, or 1 per token; on the mask's device."""
    masks = [torch.as_tensor(m) for m in batch["loss_masks"]]
    if per_token:
        return [torch.ones((), device=m.device) for m in masks]
    return [m.float().sum().clamp_min(1) for m in masks]


def make_sum_of_sample_mean(batch: dict, par: Parallel, per_token: bool, select: bool, masks=None):
    """slime's `sum_of_sample_mean` closure over a micro-batch (see formulas.sum_of_sample_mean).

    Args:
        masks: local masks to use instead of the batch's (the safe loss passes its keep-masks);
            denominators always come from the batch's whole loss masks.
    """
    masks = local_masks(batch, par) if masks is None else masks
    dens = denominators(batch, per_token)

    def fn(x: torch.Tensor) -> torch.Tensor:
        here = [devices.to_device(m, x.device) for m in masks], [devices.to_device(d, x.device) for d in dens]
        return sum_of_sample_mean(x, *here, select=select)

    return fn


def concat(batch: dict, key: str, device) -> torch.Tensor:
    """Concatenate a per-sample per-token key into [N] float32."""
    parts = [torch.as_tensor(x, dtype=torch.float32) for x in batch[key]]
    return devices.to_device(torch.cat(parts) if parts else torch.zeros(0), device)


def finish(
    loss: torch.Tensor, log: dict, *, batch: dict, args, num_microbatches: int, logits: torch.Tensor, par: Parallel
):
    """slime v0.1.0's loss_function tail: scale for Megatron and pack the metrics.

    Megatron sums micro-batch losses, multiplies by cp_size and averages gradients over the DP x CP
    group; slime scales by num_microbatches / global_batch_size * dp_cp_size so that the result is
    the mean over the global batch.

    Returns:
        (loss, normalizer, {"keys": [...], "values": [num_samples or num_tokens, *metrics]}).
    """
    num_tokens = sum(batch["response_lengths"])
    num_samples = len(batch["response_lengths"])
    per_token = args.calculate_per_token_loss
    loss = loss * num_microbatches / args.global_batch_size * par.dp_cp_size
    device = logits.device
    # stacked on the logits' device: slime's torch.tensor([...]) reads each metric to the host instead (one sync each)
    values = torch.stack(
        [devices.full(float(num_tokens if per_token else num_samples), device)]
        + [devices.to_device(torch.as_tensor(v), device).float().reshape(()) for v in log.values()]
    )
    return loss, (num_tokens if per_token else 1), {"keys": list(log.keys()), "values": values}


def slice_for_cp(batch: dict, par: Parallel) -> dict:
    """A whole-sequence micro-batch (cp_size 1) as CP rank `par.cp_rank` receives it from slime.

    Per-token keys keep only this rank's response tokens (layout order); tokens, lengths and the
    loss masks stay whole, as in slime.
    """
    out = dict(batch)
    for key in PER_TOKEN:
        if key in batch:
            out[key] = [
                torch.as_tensor(x)[layout.response_positions(t, r, par.cp_rank, par.cp_size)]
                for x, t, r in zip(batch[key], batch["total_lengths"], batch["response_lengths"])
            ]
    return out


def cp_local_logits(full: torch.Tensor, total_lengths: list[int], par: Parallel) -> torch.Tensor:
    """CP rank `par.cp_rank`'s packed row cut from a whole-sequence row, zero rows for padding.

    Args:
        full: [1, sum total_i, V] logits of the micro-batch without CP.
    Returns:
        [1, sum local_length_i, V]: what that CP rank's model outputs (differentiable w.r.t. `full`).
    """
    index, pad, base = [], [], 0
    for total in total_lengths:
        for p in layout.sequence_positions(total, par.cp_rank, par.cp_size):
            index.append(base + min(p, total - 1))
            pad.append(p >= total)
        base += total
    rows = full[0].index_select(0, devices.to_device(torch.tensor(index, dtype=torch.long), full.device))
    pad = devices.to_device(torch.tensor(pad), full.device).unsqueeze(-1)
    return torch.where(pad, torch.zeros_like(rows), rows).unsqueeze(0)
