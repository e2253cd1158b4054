"""The fix: slime v0.1.0's GRPO policy loss made NaN-safe ("safe"), same API as `as_is`.

It composes the same formulas as `as_is` and changes only what numerical safety needs:

1. Non-finite inputs are neutralised before any arithmetic (torch.clamp passes NaN, and a NaN
   anywhere in a product poisons its backward): a non-finite old/ref/rollout log-prob is replaced
   by a value that makes its term trivial, and the token leaves the loss; a non-finite advantage
   removes its whole sample. Policy `drop` (default) counts them in `nan_guard/*` metrics;
   `strict` raises one error naming the sample and token.
2. Every log-ratio is clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] = [-20, 20] BEFORE exp (PPO
   ratio, KL estimator, TIS). exp can then not overflow (fp32 overflows above 88.72), so no inf
   derivative ever meets a zero gradient. Selecting after exp (torch.where) would not do: the
   unselected branch still gets a zero gradient and exp's backward computes 0 * inf = NaN.
   The bound never binds on healthy data (see formulas.LOG_RATIO_BOUND).
3. Terms whose coefficient is 0 (kl_loss_coef, entropy_coef) are computed outside the autograd
   graph: still reported, never differentiated.
4. Masks select instead of multiply, so whatever sits at a masked position reaches neither the
   sum nor the backward.

On healthy batches the loss and gradients equal `as_is`'s (measured in tests/loss/test_safe.py).

    from nanscope.loss import safe
    loss, normalizer, log = safe.loss_function(args, batch, num_microbatches, logits)
"""

from __future__ import annotations

import torch

from nanscope.loss import layout, microbatch
from nanscope.loss.formulas import FP32_EXP_MAX, LOG_RATIO_BOUND, approx_kl, ppo_clip_loss, tis_weights
from nanscope.loss.microbatch import Parallel

NAN_POLICIES = ("drop", "strict")


class NonFiniteInputError(ValueError):
    """A non-finite log-prob or advantage reached the loss under nan_policy='strict'."""


def _clamp(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _locate(batch: dict, par: Parallel, flat_index: int) -> tuple[int, int]:
    """(sample, response position) of the flat_index-th local token."""
    for i, (total, response) in enumerate(zip(batch["total_lengths"], batch["response_lengths"])):
        positions = layout.response_positions(total, response, par.cp_rank, par.cp_size)
        if flat_index < len(positions):
            return i, positions[flat_index]
        flat_index -= len(positions)
    raise AssertionError("token index beyond the micro-batch")


def _guard(batch: dict, par: Parallel, keys: list[str], device, nan_policy: str) -> dict:
    """Concatenate per-token inputs and find their non-finite entries.

    Returns:
        {key: (values [N] with non-finite entries still in place, finite mask [N] bool)}.
    Raises:
        NonFiniteInputError: under nan_policy 'strict', for the first non-finite entry.
    """
    out = {}
    for key in keys:
        x = microbatch.concat(batch, key, device)
        finite = torch.isfinite(x)
        if nan_policy == "strict" and not finite.all():
            k = int((~finite).nonzero()[0])
            sample, token = _locate(batch, par, k)
            raise NonFiniteInputError(f"{key} is {float(x[k])} at sample {sample}, response token {token} (nan_policy=strict)")
        out[key] = (x, finite)
    return out


def policy_loss(
    args,
    batch: dict,
    logits: torch.Tensor,
    sum_of_sample_mean=None,
    *,
    parallel: Parallel | None = None,
    nan_policy: str | None = None,
):
    """NaN-safe policy loss with slime v0.1.0's signature.

    Args:
        args: namespace with slime's field names; `args.nan_policy` ("drop"/"strict") if present.
        batch: slime micro-batch.
        logits: [1, T_local, V_local] float32.
        sum_of_sample_mean: accepted for slime's calling convention and not used: it masks by
            multiplication over the batch's masks, while this loss selects over masks that also
            drop non-finite tokens.
        parallel: parallel coordinates; default megatron-core's parallel state, else one process.
        nan_policy: overrides args.nan_policy.

    Returns:
        (loss, metrics): the metrics of `as_is` plus `nan_guard/*` counters (token or sample
        counts summed over the micro-batch; slime reports them divided by the number of samples).
    """
    par = parallel or Parallel.from_megatron()
    nan_policy = nan_policy or getattr(args, "nan_policy", None) or "drop"
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy {nan_policy!r}: expected one of {', '.join(NAN_POLICIES)}")
    if args.advantage_estimator == "gspo":
        raise ValueError("advantage_estimator 'gspo' (sequence-level ratio) is not modelled by nanscope")

    logp, ent = microbatch.log_probs_and_entropy(
        logits, batch, args.rollout_temperature, par, with_entropy_grad=args.entropy_coef != 0
    )
    device = logp.device
    keys = ["log_probs", "advantages"] + ["rollout_log_probs"] * args.use_tis + ["ref_log_probs"] * args.use_kl_loss
    inputs = _guard(batch, par, keys, device, nan_policy)

    # 1. neutralise: drop non-finite tokens (and samples with a non-finite advantage) from the loss.
    masks = microbatch.local_masks(batch, par)
    sizes = [m.numel() for m in masks]
    adv, adv_finite = inputs["advantages"]
    # per sample: are all its local advantages finite? [B] bool, then broadcast to its tokens [N]
    sample_finite = torch.stack([f.all() for f in adv_finite.split(sizes)]) if sizes else adv_finite.new_zeros(0)
    sample_ok = torch.repeat_interleave(sample_finite, torch.tensor(sizes, device=device))
    keep = sample_ok.clone()
    for key in keys:
        keep &= inputs[key][1]
    old = torch.where(inputs["log_probs"][1], inputs["log_probs"][0], logp.detach())
    advantages = torch.where(sample_ok, adv, torch.zeros_like(adv))

    # 2. clamp log-ratios before exp.
    ppo_kl = _clamp(old - logp)
    pg, clipfrac = ppo_clip_loss(ppo_kl, advantages, args.eps_clip, args.eps_clip_high)
    if args.use_tis:
        rollout = torch.where(inputs["rollout_log_probs"][1], inputs["rollout_log_probs"][0], old)
        tis, tis_clipped = tis_weights(_clamp(old - rollout), args.tis_clip_low, args.tis_clip)
        ois = (-ppo_kl).exp()
        pg = pg * tis_clipped

    # 4. select with the keep-masks; denominators stay the whole loss masks' sums.
    local_keep = [m.bool() & k for m, k in zip(masks, keep.cpu().split(sizes))]
    ssm = microbatch.make_sum_of_sample_mean(batch, par, args.calculate_per_token_loss, select=True, masks=[k.float() for k in local_keep])
    pg_loss = ssm(pg)
    entropy_loss = ssm(ent)
    # 3. zero-coefficient terms stay out of the graph.
    loss = pg_loss - args.entropy_coef * entropy_loss if args.entropy_coef != 0 else pg_loss

    if args.use_kl_loss:
        ref = torch.where(inputs["ref_log_probs"][1], inputs["ref_log_probs"][0], logp.detach())
        with torch.set_grad_enabled(args.kl_loss_coef != 0 and torch.is_grad_enabled()):
            kl_loss = ssm(approx_kl(_clamp(logp - ref), args.kl_loss_type))
        if args.kl_loss_coef != 0:
            loss = loss + args.kl_loss_coef * kl_loss

    if logp.numel() == 0 or not loss.requires_grad:  # keep the graph connected
        loss = loss + 0 * logits.sum()

    metrics = {
        "loss": loss,
        "pg_loss": pg_loss,
        "entropy_loss": entropy_loss,
        "pg_clipfrac": ssm(clipfrac),
        "ppo_kl": ssm(ppo_kl),
    }
    if args.use_kl_loss:
        metrics["kl_loss"] = kl_loss
    if args.use_tis:
        metrics["tis"] = ssm(tis)
        metrics["ois"] = ssm(ois)
        metrics["tis_clipfrac"] = ssm((tis_clipped != tis).float())
    metrics.update(_guard_counters(inputs, keys, masks, keep, sample_finite, logp.detach(), old, args))
    return loss, {k: v.detach().clone() for k, v in metrics.items()}


def _guard_counters(inputs, keys, masks, keep, sample_finite, logp, old, args) -> dict:
    """nan_guard/* metrics: what the guards neutralised in this micro-batch.

    <key>: non-finite entries of that input (tokens); advantages: samples with a non-finite
    advantage; exp_overflow: tokens where a log-ratio would have overflowed fp32 exp (> 88.72),
    prevented by the clamp; dropped_tokens: tokens with loss_mask 1 removed from the loss.
    """
    out = {f"nan_guard/{k}": (~inputs[k][1]).sum().float() for k in keys if k != "advantages"}
    out["nan_guard/advantages"] = (~sample_finite).sum().float()
    with torch.no_grad():
        overflow = (logp - old) > FP32_EXP_MAX
        if args.use_kl_loss:
            overflow |= (inputs["ref_log_probs"][0] - logp) > FP32_EXP_MAX
        if args.use_tis:
            overflow |= (old - inputs["rollout_log_probs"][0]) > FP32_EXP_MAX
    out["nan_guard/exp_overflow"] = overflow.sum().float()
    trained = torch.cat([m.bool() for m in masks]).to(keep.device) if masks else keep
    out["nan_guard/dropped_tokens"] = (trained & ~keep).sum().float()
    return out


def loss_function(args, batch: dict, num_microbatches: int, logits: torch.Tensor, *, parallel: Parallel | None = None):
    """slime v0.1.0's loss_function with the safe policy loss (same scaling and metric packing)."""
    par = parallel or Parallel.from_megatron()
    loss, log = policy_loss(args, batch, logits, parallel=par)
    return microbatch.finish(loss, log, batch, args, num_microbatches, logits, par)
