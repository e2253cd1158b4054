"""The fix on nanscope's model of slime v0.1.0 ("safe"): `as_is` called through the plugin's guard.

This is the fix exactly as the slime plugin applies it to a real slime release
(`nanscope.loss.guard.call`), with `as_is` in the role of slime's loss module. Nothing of the
loss is re-implemented here; the guard changes only what numerical safety needs:

1. Inputs: a non-finite old/ref/rollout log-prob becomes 0 and its token leaves the loss; a
   non-finite advantage removes its whole sample (torch.clamp passes NaN, and a NaN anywhere in a
   product poisons its backward). Policy `drop` (default) counts them in `nan_guard/*` metrics;
   `strict` raises one error naming the sample and token.
2. Exp: while `as_is` runs, its log-ratio helpers (PPO ratio, KL estimator, TIS) get the log-ratio
   clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] = [-20, 20] BEFORE exp. exp can then not overflow
   (fp32 overflows above 88.72), so no inf derivative ever meets a zero gradient. Selecting after exp
   (torch.where) would not do: the unselected branch still gets a zero gradient and exp's backward
   computes 0 * inf = NaN. The bound never binds on healthy data (see facts.numerics.LOG_RATIO_BOUND).
3. Reducer: masks select instead of multiply, so whatever sits at a masked position reaches neither
   the sum nor the backward. Denominators stay the whole loss masks' sums.

On healthy batches the loss and gradients equal `as_is`'s bitwise (tests/loss/test_safe.py,
`python -m nanscope.equivalence`).

    from nanscope.loss import safe
    loss, normalizer, log = safe.loss_function(args, batch, num_microbatches, logits)
"""

from __future__ import annotations

import torch

from nanscope.loss import microbatch, target
from nanscope.loss.guard import NAN_POLICIES, NonFiniteInputError, call
from nanscope.loss.microbatch import Parallel

__all__ = ["NAN_POLICIES", "NonFiniteInputError", "loss_function", "policy_loss"]


def policy_loss(
    args,
    batch: dict,
    logits: torch.Tensor,
    sum_of_sample_mean=None,
    *,
    parallel: Parallel | None = None,
    nan_policy: str | None = None,
):
    """NaN-safe policy loss with slime v0.1.0's signature: `as_is.policy_loss` inside the guard.

    Args:
        args: namespace with slime's field names; `args.nan_policy` ("drop"/"strict") if present.
        batch: slime micro-batch.
        logits: [1, T_local, V_local] float32.
        sum_of_sample_mean: slime's reducer over the batch's masks; built here when not given. The
            guard hands `as_is` a reducer that selects over it (and drops non-finite tokens).
        parallel: parallel coordinates; default megatron-core's parallel state, else one process.
        nan_policy: overrides args.nan_policy.

    Returns:
        (loss, metrics): the metrics of `as_is` plus `nan_guard/*` counters (token or sample
        counts summed over the micro-batch; slime reports them divided by the number of samples).
    """
    par = parallel or Parallel.from_megatron()
    nan_policy = nan_policy or getattr(args, "nan_policy", None) or "drop"
    if sum_of_sample_mean is None:
        sum_of_sample_mean = microbatch.make_sum_of_sample_mean(batch, par, args.calculate_per_token_loss, select=False)
    return call(target.model(), args, batch, logits, sum_of_sample_mean, nan_policy=nan_policy, parallel=par)


def loss_function(args, batch: dict, num_microbatches: int, logits: torch.Tensor, *, parallel: Parallel | None = None):
    """slime v0.1.0's loss_function with the safe policy loss (same scaling and metric packing)."""
    par = parallel or Parallel.from_megatron()
    loss, log = policy_loss(args, batch, logits, parallel=par)
    return microbatch.finish(
        loss, log, batch=batch, args=args, num_microbatches=num_microbatches, logits=logits, par=par
    )
