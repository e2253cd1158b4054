"""The harness's sentinel: each run's model under `nanscope.trace.sentinels.sentinel.Sentinel`, each step read and
classified.

    ctx.sentinel = Sentinel([ctx.model])     # after any planted fault (megatron.faults): hooks run in order
    ...train_one_step...                     # step.py records whether the gradient entering the model was finite
    observe(ctx, batch, stepped)             # -> ctx.record.sentinel

Module and parameter names are public (megatron.faults.public_name: wrappers stripped, decoder layers
global), so a finding names a module exactly as `--fault` and `--list-modules` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nanscope.trace.sentinels.classify import Observation, classify
from nanscope.trace.sentinels.observe import layer_offset, nonfinite_counts, public_hit, public_name, public_producer

if TYPE_CHECKING:
    from nanscope.megatron.context import RunContext

SHOWN = 20  # parameter names kept in a record


def observe(ctx: RunContext, batch: dict, stepped: bool) -> None:
    """Read the sentinel after a step and classify the reading (trace.sentinels.classify) into `ctx.record.sentinel`.

    The record keeps the first step with a non-finite value, else the latest step.

    Args:
        batch: the step's slime batch (what reached the loss on the last stage).
        stepped: the optimizer step ran (parameters are then checked too).
    """
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, imported in the ranks only

    reading = ctx.sentinel.read(grads=True)
    seen = [bool(g) for g in ctx.output_grads]
    ctx.output_grads.clear()
    prev = ctx.record.sentinel
    if prev is not None and prev["candidates"]:
        return
    off, last = layer_offset([ctx.model]), mpu.is_pipeline_last_stage()
    inputs = nonfinite_counts([batch]) if last else None
    params = ()
    if stepped:
        params = tuple(public_name(n, off) for n, p in ctx.model.named_parameters() if not torch.isfinite(p).all())
    obs = Observation(
        forward=public_hit(reading.forward, off),
        backward=public_hit(reading.backward, off),
        grads=tuple(public_name(g, off) for g in reading.grads),
        loss_inputs=inputs,
        output_grad_finite=all(seen) if seen else None,
        last_stage=last,
        nonfinite_params=params,
        producer=public_producer(reading.producer, off),
    )
    ctx.record.sentinel = {
        "step": ctx.step,
        "forward": None if obs.forward is None else obs.forward.to_dict(),
        "backward": None if obs.backward is None else obs.backward.to_dict(),
        "producer": None if obs.producer is None else obs.producer.to_dict(),
        "grads": list(obs.grads[:SHOWN]),
        "output_grad_finite": obs.output_grad_finite,
        "loss_inputs": None if inputs is None else {k: list(v) for k, v in inputs.items()},
        "nonfinite_params": list(params[:SHOWN]),
        "last_stage": last,
        # the MoE layers' per-expert token counts of the failing micro-batch (a healthy step: how many were kept)
        "expert_tokens": reading.expert_tokens(off),
        **classify(obs).to_dict(),
    }
