"""The test-only fault the verl tests plant in a model (not a stand-in: it replaces nothing of verl's).

`nan_output(module, when)` makes `module`'s forward output NaN, on every pass ("every") or on the first only
("first"), by a forward hook; a tuple output (megatron-core's MLP returns (output, bias)) gets its first element
made NaN. Used by tests/verl/rank.py (rank 1's model.layers.1.mlp, through verl's worker) and by
tests/verl_plugin/megatron_gate_worker.py (decoder.layers.0.mlp, on megatron-core's DDP chunks).
"""

from __future__ import annotations

WHEN = ("every", "first")


def nan_output(module, when: str):
    """Register the hook on `module`; returns its handle."""
    assert when in WHEN, when
    passes = [0]

    def hook(_module, _args, out):
        passes[0] += 1
        if when == "first" and passes[0] > 1:
            return None
        if isinstance(out, tuple):
            return (out[0] * float("nan"), *out[1:])
        return out * float("nan")

    return module.register_forward_hook(hook)
