"""The guard on padded per-token loss inputs ([B, T], verl's layout): each formula once, pure, no host sync.

verl hands a policy loss padded [B, T] tensors (B samples of the micro-batch, T the longest response): the old,
current and reference log-probs, the advantages, the response mask and the rollout importance weights
(verl v0.9.0 verl/workers/utils/losses.py:86-112). What the guard does to them, and why (the hazards measured
in shared/research/verl-plugin.md §1):

    cleaned       a non-finite entry becomes 0 and its token leaves the mask: masking alone leaves NaN * 0 in
                  the backward pass (a NaN advantage at a masked token makes the gradient NaN)
    selected      at masked tokens the advantages become 0: a finite but huge masked entry times a ratio would
                  make inf, and verl's seq-mean-* aggregation multiplies by the mask (core_algos.py:1182,1196),
                  inf * 0 = NaN; with 0 there the product is +-0, what selection gives. The engine's cleaning
                  does the same to ref_log_prob, the KL term's input (nanscope.verl_plugin.inputs)
    bounded_old   the old log-prob moved so that |log_prob - old| <= LOG_RATIO_BOUND (20) at every token, masked
                  ones included, before the loss exponentiates the difference: clip_cov and kl_cov take exp of it
                  unclamped (core_algos.py:1796-1797, 1890), geo_mean too (:1972, 1983); exp(x > 88.72) is inf
                  in fp32, and its inf derivative meets the mask's zero gradient (0 * inf = NaN). The moved
                  difference has zero gradient, as torch.clamp's has outside its range (verl's own vanilla
                  clamp, :1336-1339)

On healthy data (every entry finite, |log-ratio| <= 20 everywhere) the selections keep every bit of the trained
entries, so the inner loss computes what it computes without the guard (signed zeros at masked entries aside).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanscope.facts.numerics import FP32_EXP_MAX, LOG_RATIO_BOUND


def cleaned(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with its non-finite entries 0, [same shape] bool: the entry was finite). Any shape, any float dtype."""
    finite = torch.isfinite(x)
    return torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device)), finite


def masked_out(mask: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """`mask` ([B, T], any dtype) with 0 where `drop` ([B, T] bool) is set; its dtype kept."""
    return torch.where(drop, torch.zeros((), dtype=mask.dtype, device=mask.device), mask)


def selected(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`x` [B, T] where `mask` [B, T] is non-zero, 0 elsewhere (a masked entry then multiplies to +-0)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def bounded_old(old_log_prob: torch.Tensor, log_prob: torch.Tensor, bound: float = LOG_RATIO_BOUND) -> torch.Tensor:
    """The old log-probs, moved where |log_prob - old| > bound so that the difference is clamped to [-bound, bound].

    Args:
        old_log_prob: [B, T] float32, finite (`cleaned` first); no gradient.
        log_prob: [B, T] float32, the current policy's, with its gradient.

    Returns:
        [B, T]: `old_log_prob` itself where |log_prob - old| <= bound (the same bits); elsewhere
        log_prob - clamp(log_prob - old), so that log_prob - result is the clamped difference (to rounding) and
        its gradient with respect to log_prob is 0 (torch.clamp's outside its range). A NaN log_prob keeps old
        (NaN > bound is False): a non-finite model output stays visible to the sentinel.
    """
    diff = log_prob.detach() - old_log_prob
    far = diff.abs() > bound
    return torch.where(far, log_prob - diff.clamp(-bound, bound), old_log_prob)


@dataclass(frozen=True)
class Headroom:
    """How close one micro-batch's loss came to overflowing: 0-dim tensors on the inputs' device.

    Attributes:
        max_log_ratio: the largest log_prob - old over every token, masked included (where exp(log_prob - old) is
            taken); NaN if one is NaN; -inf for no token.
        sample: the row (sample of the micro-batch) holding it, int64; -1 for no token.
        overflow: float32, tokens whose log_prob - old exceeds FP32_EXP_MAX (fp32 exp would be inf).
        clamped: float32, tokens whose |log_prob - old| exceeds LOG_RATIO_BOUND (the guard moved them).
    """

    max_log_ratio: torch.Tensor
    sample: torch.Tensor
    overflow: torch.Tensor
    clamped: torch.Tensor


def headroom(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> Headroom:
    """The micro-batch's `Headroom` from the finite old log-probs and the current ones, both [B, T]."""
    diff = (log_prob.detach() - old_log_prob).float()
    device = diff.device
    if diff.numel() == 0:
        zero = torch.zeros((), device=device)
        return Headroom(torch.full((), float("-inf"), device=device), torch.full((), -1, device=device), zero, zero)
    flat = diff.reshape(-1)
    nan = torch.isnan(flat)
    at = torch.where(nan.any(), nan.int().argmax(), flat.argmax())
    value = torch.where(nan.any(), torch.full((), float("nan"), device=device), flat.index_select(0, at.reshape(1))[0])
    return Headroom(
        max_log_ratio=value,
        sample=at // max(diff.shape[-1], 1),
        overflow=(diff > FP32_EXP_MAX).sum().float(),
        clamped=(diff.abs() > LOG_RATIO_BOUND).sum().float(),
    )
