"""One rank's headroom row for the step's vote, from what the `nanscope` loss mode recorded (`record.Call`).

The row has the slime plugin's layout (`nanscope.slime_plugin.headroom.FIELDS`, which `step_vote` reads by name),
so the vote, its maxima with their rank, micro-batch and sample, and its warnings are the slime plugin's own:

    ppo               max of log_prob - old over every token (masked ones too: verl's loss exponentiates them),
                      the micro-batch and sample holding it
    clamped           tokens whose |log_prob - old| passed the guard's 20
    nonfinite_inputs  non-finite loss-input entries the engine's cleaning replaced (`inputs`)
    kl, tis, gap      not measured for verl (-inf / 0: the vote reports them as None)

Device tensors only: stacked, never read (the vote reads the whole row once).
"""

from __future__ import annotations

import torch

from nanscope.loss import devices
from nanscope.slime_plugin.headroom import FIELDS
from nanscope.verl_plugin.record import Call

_NONE = {"value": float("-inf"), "microbatch": -1.0, "sample": -1.0}


def row(calls: list[Call], nonfinite_inputs: torch.Tensor, device) -> torch.Tensor:
    """[len(FIELDS)] float32 on `device`: this rank's step (`calls`: the loss calls of its pass)."""
    measured = [c for c in calls if c.headroom is not None]
    entries: dict[str, torch.Tensor] = {}
    if measured:
        entries |= _ppo(measured, device)
        entries["clamped"] = torch.stack([c.headroom.clamped.to(device) for c in measured]).sum()
    entries["nonfinite_inputs"] = nonfinite_inputs.to(device)
    out = []
    for name in FIELDS:
        if name in entries:
            out.append(entries[name].float().reshape(()))
        else:
            out.append(devices.full(_default(name), device))
    return torch.stack(out)


def _ppo(measured: list[Call], device) -> dict[str, torch.Tensor]:
    """ppo_value, ppo_microbatch, ppo_sample: the largest of the calls' maxima (a NaN is the largest)."""
    values = torch.stack([c.headroom.max_log_ratio.to(device) for c in measured])
    nan = torch.isnan(values)
    at = torch.where(nan.any(), nan.int().argmax(), values.argmax()).reshape(1)
    samples = torch.stack([c.headroom.sample.to(device) for c in measured]).float()
    microbatches = devices.to_device(torch.tensor([float(c.microbatch) for c in measured]), device)
    picked = [t.index_select(0, at)[0] for t in (values, microbatches, samples)]
    return dict(zip(("ppo_value", "ppo_microbatch", "ppo_sample"), picked))


def _default(name: str) -> float:
    part = name.rsplit("_", 1)[-1]
    if name == "gap_p99":
        return float("-inf")
    return _NONE.get(part, 0.0)
