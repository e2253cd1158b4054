"""The harness's sentinel: each run's model under `nanscope.trace.Sentinel`, each step read and classified.

    ctx.sentinel = Sentinel([ctx.model])     # after any planted fault (megatron.faults): hooks run in order
    ...train_one_step...                     # step.py records whether the gradient entering the model was finite
    observe(ctx, batch, stepped)             # -> ctx.record.sentinel

Module and parameter names are public (megatron.faults.public_name: wrappers stripped, decoder layers
global), so a finding names a module exactly as `--fault` and `--list-modules` do.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from nanscope.megatron.faults import public_name

if TYPE_CHECKING:
    from nanscope.megatron.worker import RunContext

LOSS_INPUTS = ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages")
SHOWN = 20  # parameter names kept in a record


def layer_offset(ctx: RunContext) -> int:
    """The first global decoder layer of this rank's stage (megatron numbers a stage's layers from 0)."""
    return ctx.record.layers[0] if ctx.record.layers else 0


def observe(ctx: RunContext, batch: dict, stepped: bool) -> None:
    """Read the sentinel after a step and classify the reading (trace.classify) into `ctx.record.sentinel`.

    The record keeps the first step with a non-finite value, else the latest step.

    Args:
        batch: the step's slime batch (what reached the loss on the last stage).
        stepped: the optimizer step ran (parameters are then checked too).
    """
    from megatron.core import parallel_state as mpu

    from nanscope.trace.classify import Observation, classify

    reading = ctx.sentinel.read(grads=True)
    seen = [bool(g) for g in ctx.output_grads]
    ctx.output_grads.clear()
    prev = ctx.record.sentinel
    if prev is not None and prev["candidates"]:
        return
    off, last = layer_offset(ctx), mpu.is_pipeline_last_stage()
    inputs = _loss_inputs(batch) if last else None
    params = ()
    if stepped:
        params = tuple(public_name(n, off) for n, p in ctx.model.named_parameters() if not torch.isfinite(p).all())
    obs = Observation(_public(reading.forward, off), _public(reading.backward, off),
                      tuple(public_name(g, off) for g in reading.grads), inputs, all(seen) if seen else None, last,
                      params, producer=_public_producer(reading.producer, off))  # fmt: skip
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
        **classify(obs).to_dict(),
    }


def _loss_inputs(batch: dict) -> dict[str, tuple[int, int]]:
    """(non-finite entries, entries) of each loss input of the step's batch."""
    return {k: (sum(int((~torch.isfinite(x)).sum()) for x in batch[k]), sum(x.numel() for x in batch[k]))
            for k in LOSS_INPUTS if k in batch}  # fmt: skip


def _public(hit, offset: int):
    """A sentinel Hit with public module and parameter names."""
    if hit is None:
        return None
    param = None if hit.param is None else public_name(hit.param, offset)
    return dataclasses.replace(hit, module=public_name(hit.module, offset), param=param)


def _public_producer(producer, offset: int):
    """A sentinel Producer with public module names."""
    if producer is None:
        return None
    module = None if producer.module is None else public_name(producer.module, offset)
    return dataclasses.replace(producer, module=module, seen_at=public_name(producer.seen_at, offset))
