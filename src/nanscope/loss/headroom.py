"""How far a micro-batch's loss is from overflowing: the log-ratios that reach an exp, and the train-rollout gap.

slime's loss exponentiates three log-ratios (every release here, before any clamp in v0.1.0):

    PPO ratio   exp(logp - old)          old = log_probs (the log-prob pass), or rollout_log_probs under
                                         --use-rollout-logprobs
    KL          exp(ref - logp)          k3 / low_var_kl (compute_approx_kl: log_ratio = logp - ref, exp(-log_ratio))
    TIS         exp(old - rollout)       old = log_probs

fp32's exp overflows above FP32_EXP_MAX = 88.72; the guard clamps every log-ratio to [-20, 20]. Masked
tokens count: slime computes exp on them too. The train-rollout gap |logp - rollout| is taken over trained
tokens (loss_mask 1) only, where the engine's log-probs mean something.

Every function takes this rank's local tokens, samples concatenated ([N] float32, as `nanscope.loss.microbatch`
lays them out), returns 0-dim tensors on the inputs' device, and never syncs with the host (no `.item()`, no
Python value copied to the device, no boolean mask): a NaN input gives a NaN maximum, no token gives -inf.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanscope.facts.numerics import LOG_RATIO_BOUND

# The estimators whose KL term exponentiates ref - logp (v0.1.0's kl / k2 and v0.2's k1 / k2 do not).
KL_EXPONENTIATED = ("k3", "low_var_kl")


@dataclass(frozen=True)
class Maximum:
    """The largest entry of a per-token tensor and where it is: 0-dim tensors (value float32, sample int64)."""

    value: torch.Tensor
    sample: torch.Tensor  # index of the sample (in the micro-batch) holding it; -1 when there is no token


def maximum(x: torch.Tensor, sizes: torch.Tensor, keep: torch.Tensor | None = None) -> Maximum:
    """The maximum of `x` [N] over the entries `keep` [N] bool selects (all by default), and its sample.

    Args:
        sizes: [S] int64, each sample's number of local tokens (sum = N).

    A NaN anywhere selected is the maximum (NaN), an empty selection gives -inf at sample -1.
    """
    x = x.float()
    if keep is not None:
        x = torch.where(keep, x, torch.full_like(x, float("-inf")))
    none = torch.full((), -1, dtype=torch.int64, device=x.device)  # a fill, not a copy from the host
    if x.numel() == 0:
        return Maximum(torch.full((), float("-inf"), device=x.device), none)
    nan = torch.isnan(x)
    at = torch.where(nan.any(), nan.int().argmax(), x.argmax())  # argmax ignores NaN: point at the first one
    # x[at] would read `at` on the host (a 0-dim index is taken as a Python int); index_select stays on the device
    value = torch.where(nan.any(), torch.full((), float("nan"), device=x.device), x.index_select(0, at.reshape(1))[0])
    ends = sizes.to(x.device).cumsum(0)
    sample = torch.searchsorted(ends, at, right=True)
    sample = torch.where(value == float("-inf"), none, sample)
    return Maximum(value, sample)


def ppo_log_ratio(logp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """[N]: what the PPO ratio exponentiates, logp - old."""
    return logp.float() - old.float()


def kl_log_ratio(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """[N]: what k3 / low_var_kl exponentiate, ref - logp."""
    return ref.float() - logp.float()


def tis_log_ratio(old: torch.Tensor, rollout: torch.Tensor) -> torch.Tensor:
    """[N]: what TIS exponentiates, old - rollout (rollout log-probs may be bf16: compared in fp32)."""
    return old.float() - rollout.float()


def train_rollout_gap(logp: torch.Tensor, rollout: torch.Tensor) -> torch.Tensor:
    """[N]: |logp - rollout|, the current policy's log-prob against the engine's."""
    return (logp.float() - rollout.float()).abs()


def clamped(log_ratios: list[torch.Tensor]) -> torch.Tensor:
    """0-dim int64: tokens where any of the log-ratios [N] lies beyond the guard's ±LOG_RATIO_BOUND (NaN is not)."""
    if not log_ratios or log_ratios[0].numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=log_ratios[0].device if log_ratios else None)
    beyond = torch.stack([r.abs() > LOG_RATIO_BOUND for r in log_ratios]).any(dim=0)
    return beyond.sum()


def quantile(x: torch.Tensor, q: float) -> torch.Tensor:
    """0-dim: the q-quantile of `x` [N] (linear interpolation, as torch.quantile); -inf for no entry, NaN if any."""
    if x.numel() == 0:
        return torch.full((), float("-inf"), device=x.device)
    return torch.quantile(x.float(), q)
