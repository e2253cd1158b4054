"""Every formula of slime v0.1.0's GRPO policy loss, once, as pure functions on tensors.

`as_is` composes them the way slime v0.1.0 does (defects included); `safe` composes the same
functions with the guards that make them NaN-free. Nothing here reads global state: the
tensor-parallel group, when there is one, is an argument.

Notation: N is the number of local response tokens (all samples of a micro-batch, concatenated),
V the local (tensor-parallel) vocabulary shard. All per-token tensors are float32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_reduce(t: torch.Tensor, op, group) -> None:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)


def _vocab_start(group, local_vocab: int) -> int:
    rank = dist.get_rank(group) if group is not None else 0
    return rank * local_vocab


class _VocabParallelLogProb(torch.autograd.Function):
    """log p(token) from vocab-sharded logits, with the semantics of megatron-core 0.15's
    fused_vocab_parallel_cross_entropy (which slime v0.1.0 calls, negated).

    Forward: shift by the max logit (all-reduced MAX over TP), then
    logp = (logit[token] - max) - log(sum exp(logit - max)), both terms all-reduced SUM over TP.
    Backward: d logp / d logit = onehot - softmax, multiplied by the incoming gradient and rounded
    to bfloat16, as megatron's fused backward does (`grad_input.to(torch.bfloat16)`).
    """

    @staticmethod
    def forward(ctx, logits, tokens, group):
        # logits: [N, V] fp32 (this rank's vocab shard); tokens: [N] int64 global vocab ids.
        logits_max = logits.max(dim=-1).values  # [N]
        _all_reduce(logits_max, dist.ReduceOp.MAX, group)
        shifted = logits - logits_max.unsqueeze(-1)  # [N, V]
        start = _vocab_start(group, logits.size(-1))
        local = tokens - start
        in_shard = (local >= 0) & (local < logits.size(-1))  # [N]
        local = local.clamp(0, logits.size(-1) - 1)
        rows = torch.arange(logits.size(0), device=logits.device)
        predicted = torch.where(in_shard, shifted[rows, local], torch.zeros_like(logits_max))  # [N]
        exp_shifted = shifted.exp()
        sum_exp = exp_shifted.sum(dim=-1)  # [N]
        both = torch.cat((predicted, sum_exp))
        _all_reduce(both, dist.ReduceOp.SUM, group)
        predicted, sum_exp = both.split(logits.size(0))
        softmax = exp_shifted.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, in_shard, local)
        return predicted - sum_exp.log()

    @staticmethod
    def backward(ctx, grad_logp):
        softmax, in_shard, local = ctx.saved_tensors
        rows = torch.arange(softmax.size(0), device=softmax.device)
        # d(-logp)/d logits = softmax - onehot; chain with d loss/d(-logp) = -grad_logp.
        grad = softmax.clone()
        grad[rows, local] -= in_shard.to(grad.dtype)
        grad.mul_(-grad_logp.unsqueeze(-1))
        return grad.to(torch.bfloat16).to(softmax.dtype), None, None


def log_probs(logits: torch.Tensor, tokens: torch.Tensor, tp_group=None) -> torch.Tensor:
    """Log-probability of each token under vocab-parallel logits.

    Args:
        logits: [N, V] float32, this rank's vocabulary shard (already divided by the temperature).
        tokens: [N] int64 global token ids.
        tp_group: the tensor-parallel process group, or None for a single shard.

    Returns:
        [N] float32 log-probs (finite for any finite logits: computed in max-shifted space).
    """
    if logits.size(0) == 0:
        return logits.new_zeros((0,))
    return _VocabParallelLogProb.apply(logits, tokens, tp_group)


class _VocabParallelEntropy(torch.autograd.Function):
    """Entropy of softmax(logits) over a vocab-sharded last dimension (slime v0.1.0's form).

    H = max + log(sum exp(l - max)) - sum(softmax * l); dH/dl = -softmax * (l - sum(softmax * l)).
    """

    @staticmethod
    def forward(ctx, logits, group):
        logits_max = logits.max(dim=-1, keepdim=True).values  # [N, 1]
        _all_reduce(logits_max, dist.ReduceOp.MAX, group)
        exp_shifted = (logits - logits_max).exp()
        sum_exp = exp_shifted.sum(dim=-1, keepdim=True)
        _all_reduce(sum_exp, dist.ReduceOp.SUM, group)
        softmax = exp_shifted.div_(sum_exp)
        mean_logit = (softmax * logits).sum(dim=-1, keepdim=True)  # [N, 1]
        _all_reduce(mean_logit, dist.ReduceOp.SUM, group)
        ctx.save_for_backward(logits, softmax, mean_logit)
        return (logits_max + sum_exp.log() - mean_logit).squeeze(-1)

    @staticmethod
    def backward(ctx, grad_h):
        logits, softmax, mean_logit = ctx.saved_tensors
        return -softmax * (logits - mean_logit) * grad_h.unsqueeze(-1), None


def entropy(logits: torch.Tensor, tp_group=None) -> torch.Tensor:
    """Per-token entropy of softmax(logits).

    Args:
        logits: [N, V] float32 vocabulary shard (temperature applied).
        tp_group: tensor-parallel group or None.

    Returns:
        [N] float32 entropies.
    """
    if logits.size(0) == 0:
        return logits.new_zeros((0,))
    return _VocabParallelEntropy.apply(logits, tp_group)


def approx_kl(log_ratio: torch.Tensor, kl_loss_type: str) -> torch.Tensor:
    """Per-token KL estimator from log_ratio = logp - ref_logp (Schulman's k1/k2/k3).

    `low_var_kl` is k3 clamped to [-10, 10] AFTER exp, as slime v0.1.0 does: exp(-log_ratio)
    overflows to inf when ref_logp - logp > 88.72, the clamp hides it in the forward pass, and the
    backward pass computes 0 * inf = NaN.

    Args:
        log_ratio: [N] float32, logp - ref_logp.
        kl_loss_type: "kl" (k1), "k2", "k3" or "low_var_kl".

    Returns:
        [N] float32 per-token KL estimate.
    """
    if kl_loss_type == "kl":
        return log_ratio
    if kl_loss_type == "k2":
        return log_ratio**2 / 2.0
    if kl_loss_type in ("k3", "low_var_kl"):
        k3 = (-log_ratio).exp() - 1 + log_ratio
        return k3 if kl_loss_type == "k3" else k3.clamp(min=-10, max=10)
    raise ValueError(f"unknown kl_loss_type {kl_loss_type!r} (expected kl, k2, k3 or low_var_kl)")


def ppo_clip_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate loss per token (slime v0.1.0's compute_policy_loss).

    ratio = exp(-ppo_kl) is computed BEFORE the clip: it overflows to inf when
    logp - old_logp > 88.72, and the clip's zero gradient then meets exp's inf derivative.

    Args:
        ppo_kl: [N] float32, old_logp - logp.
        advantages: [N] float32.
        eps_clip, eps_clip_high: the ratio is clipped to [1 - eps_clip, 1 + eps_clip_high].
        eps_clip_c: dual-clip lower bound (> 1) for negative advantages, or None.

    Returns:
        (pg_losses [N], clipfrac [N] float32 in {0, 1}).
    """
    ratio = (-ppo_kl).exp()
    loss_unclipped = -ratio * advantages
    loss_clipped = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = torch.gt(loss_clipped, loss_unclipped).float()
    if eps_clip_c is not None:
        assert eps_clip_c > 1.0, f"eps_clip_c must be > 1.0 for dual-clip PPO, got {eps_clip_c}"
        pg_losses = torch.where(advantages < 0, torch.minimum(-eps_clip_c * advantages, pg_losses), pg_losses)
    return pg_losses, clipfrac


def tis_weights(log_ratio: torch.Tensor, tis_clip_low: float, tis_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance-sampling weights for rollout/train mismatch.

    Args:
        log_ratio: [N] float32, old_logp - rollout_logp (data; no gradient flows through it).
        tis_clip_low, tis_clip: the weight is clamped to [tis_clip_low, tis_clip].

    Returns:
        (tis [N] = exp(log_ratio), tis_clipped [N]). torch.clamp passes NaN through: a NaN
        rollout log-prob gives a NaN weight, which multiplies the token's loss.
    """
    tis = log_ratio.exp()
    return tis, tis.clamp(min=tis_clip_low, max=tis_clip)


def sum_of_sample_mean(
    x: torch.Tensor,
    local_masks: list[torch.Tensor],
    denominators: list[torch.Tensor],
    select: bool = False,
) -> torch.Tensor:
    """Sum over samples of each sample's masked token sum divided by its denominator.

    With one CP rank the local mask is the sample's whole loss mask and the denominator is
    clamp_min(mask.sum(), 1) (the per-sample mean); under CP each rank sees only its zigzag chunks
    but divides by the whole sample's mask sum, so the CP ranks' results add up to the same value.
    For per-token loss the denominators are 1.

    Args:
        x: [N] float32, the local tokens of all samples concatenated.
        local_masks: per sample, [n_i] float32 loss mask of its local tokens (sum n_i = N).
        denominators: per sample, a 0-dim float32 tensor.
        select: False multiplies by the mask (slime v0.1.0: a masked NaN/inf becomes NaN);
            True selects with the mask (masked values never reach the sum).

    Returns:
        0-dim float32 tensor.
    """
    parts = x.split([m.numel() for m in local_masks], dim=0)
    total = x.new_zeros(())
    for x_i, m_i, d_i in zip(parts, local_masks, denominators):
        masked = torch.where(m_i.bool(), x_i, torch.zeros_like(x_i)) if select else x_i * m_i
        total = total + masked.sum() / d_i
    return total


def grpo_normalize(rewards: torch.Tensor, group_size: int, std_normalization: bool = True) -> torch.Tensor:
    """GRPO group normalisation of rewards (slime v0.1.0's rollout controller).

    Args:
        rewards: [B] float32 raw rewards, B a multiple of group_size, groups contiguous.
        group_size: n_samples_per_prompt.
        std_normalization: also divide by (group std + 1e-6) (unbiased std, as torch.std).

    Returns:
        [B] float32. One non-finite reward makes its whole group non-finite.
    """
    assert rewards.numel() % group_size == 0, f"{rewards.numel()} rewards is not a multiple of group size {group_size}"
    groups = rewards.float().reshape(-1, group_size)
    groups = groups - groups.mean(dim=-1, keepdim=True)
    if std_normalization:
        groups = groups / (groups.std(dim=-1, keepdim=True) + 1e-6)
    return groups.flatten()
