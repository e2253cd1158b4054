"""slime v0.1.0's GRPO policy loss, numerics and defects included ("as-is").

Same signatures, argument names and batch keys as slime v0.1.0
`slime/backends/megatron_utils/loss.py`; written from its semantics. The order of operations is
v0.1.0's:

    logp, entropy  <- logits / rollout_temperature, vocab-parallel (entropy kept in the graph)
    ppo_kl = old - logp;  ratio = exp(-ppo_kl);  clip AFTER exp            (ratio-exp-overflow)
    TIS:   w = clamp(exp(old - rollout), low, high); pg *= w   (NaN passes clamp: nan-rollout-logprob)
    loss  = sum_of_sample_mean(pg) - entropy_coef * sum_of_sample_mean(entropy)
    KL:    k3 = exp(ref - logp) - 1 - (logp - ref), clamp [-10, 10] AFTER exp,
           loss += kl_loss_coef * sum_of_sample_mean(k3)   even when the coef is 0 (kl-exp-overflow)
    sum_of_sample_mean multiplies by the loss mask, so a masked NaN/inf still poisons the sum,
    and a masked token's inf derivative times its zero gradient is NaN in the backward pass.

Usage on a laptop:
    from nanscope.loss import as_is
    loss, normalizer, log = as_is.loss_function(args, batch, num_microbatches, logits)
"""

from __future__ import annotations

import importlib

import torch

from nanscope.loss import microbatch
from nanscope.loss.formulas import approx_kl, ppo_clip_loss, tis_weights
from nanscope.loss.microbatch import Parallel, log_probs_and_entropy


def policy_loss(args, batch: dict, logits: torch.Tensor, sum_of_sample_mean, *, parallel: Parallel | None = None):
    """slime v0.1.0's policy_loss_function.

    Args:
        args: namespace with slime's field names (see nanscope.facts.args.loss_args).
        batch: slime micro-batch (see nanscope.loss.microbatch).
        logits: [1, T_local, V_local] float32.
        sum_of_sample_mean: the closure slime's loss_function builds (mask by multiplication).
        parallel: parallel coordinates; default: megatron-core's parallel state, else one process.

    Returns:
        (loss 0-dim float32, metrics dict of detached 0-dim tensors).
    """
    par = parallel or Parallel.from_megatron()
    if args.advantage_estimator == "gspo":
        raise ValueError("advantage_estimator 'gspo' (sequence-level ratio) is not modelled by nanscope")
    logp, ent = log_probs_and_entropy(logits, batch, args.rollout_temperature, par)
    device = logp.device
    advantages = microbatch.concat(batch, "advantages", device)
    old_logp = microbatch.concat(batch, "log_probs", device)

    ppo_kl = old_logp - logp
    # v0.1.0 accepts --eps-clip-c but never passes it on: dual-clip is never applied.
    pg, clipfrac = ppo_clip_loss(ppo_kl, advantages, args.eps_clip, args.eps_clip_high)

    if args.use_tis:
        assert "rollout_log_probs" in batch, "rollout_log_probs must be provided for TIS"
        rollout_logp = microbatch.concat(batch, "rollout_log_probs", device)
        tis, tis_clipped = tis_weights(old_logp - rollout_logp, args.tis_clip_low, args.tis_clip)
        ois = (-ppo_kl).exp()
        pg = pg * tis_clipped

    pg_loss = sum_of_sample_mean(pg)
    pg_clipfrac = sum_of_sample_mean(clipfrac)
    ppo_kl_mean = sum_of_sample_mean(ppo_kl)
    entropy_loss = sum_of_sample_mean(ent)
    loss = pg_loss - args.entropy_coef * entropy_loss

    if args.use_kl_loss:
        ref_logp = microbatch.concat(batch, "ref_log_probs", device)
        kl_loss = sum_of_sample_mean(approx_kl(logp - ref_logp, args.kl_loss_type))
        loss = loss + args.kl_loss_coef * kl_loss

    if logp.numel() == 0:  # keep the graph connected when this rank holds no response token
        loss = loss + 0 * logits.sum()

    metrics = {
        "loss": loss,
        "pg_loss": pg_loss,
        "entropy_loss": entropy_loss,
        "pg_clipfrac": pg_clipfrac,
        "ppo_kl": ppo_kl_mean,
    }
    if args.use_kl_loss:
        metrics["kl_loss"] = kl_loss
    if args.use_tis:
        metrics["tis"] = sum_of_sample_mean(tis)
        metrics["ois"] = sum_of_sample_mean(ois)
        metrics["tis_clipfrac"] = sum_of_sample_mean((tis_clipped != tis).float())
    return loss, {k: v.detach().clone() for k, v in metrics.items()}


def loss_function(args, batch: dict, num_microbatches: int, logits: torch.Tensor, *, parallel: Parallel | None = None):
    """slime v0.1.0's loss_function: dispatch on args.loss_type, then scale for Megatron.

    `custom_loss` loads args.custom_loss_function_path and calls it with keyword arguments
    (args, batch, logits, sum_of_sample_mean), as slime does: that is how the nanscope slime plugin
    is exercised inside this model of slime.

    Returns:
        (loss, normalizer, {"keys": [...], "values": tensor}) as slime returns to Megatron's schedule.
    """
    par = parallel or Parallel.from_megatron()
    ssm = microbatch.make_sum_of_sample_mean(batch, par, args.calculate_per_token_loss, select=False)
    if args.loss_type == "policy_loss":
        loss, log = policy_loss(args, batch, logits, ssm, parallel=par)
    elif args.loss_type == "custom_loss":
        module, _, name = args.custom_loss_function_path.rpartition(".")
        fn = getattr(importlib.import_module(module), name)
        loss, log = fn(args=args, batch=batch, logits=logits, sum_of_sample_mean=ssm)
    else:
        raise ValueError(f"loss_type {args.loss_type!r} is not modelled (policy_loss or custom_loss)")
    return microbatch.finish(
        loss, log, batch=batch, args=args, num_microbatches=num_microbatches, logits=logits, par=par
    )
