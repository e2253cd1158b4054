"""Faults planted in the harness model: `MODULE:forward|backward:nan|inf`, in any module, at one step.

    nanscope repro --fault decoder.layers.0.mlp:forward:inf --fault-step 1
    nanscope repro --list-modules          # python -m nanscope.megatron.faults: the same list

MODULE is a module path as megatron names it inside GPTModel (`decoder.layers.1.mlp.router`,
`output_layer`), with the decoder layer index global: megatron numbers a pipeline stage's layers from 0,
so the harness maps `decoder.layers.G` to the stage that holds layer G and its local index there.

forward: the module's output gets one non-finite entry (its first), standing in for an activation past
the format's max or a kernel reading uninitialised memory. backward: the gradient arriving at the
module's output gets one non-finite entry before the module's own backward runs, so the module's
parameter gradients are the first non-finite ones while its inputs and outputs stay finite: a kernel
bug in its backward.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from functools import cache

import torch

from nanscope.errors import UserError
from nanscope.megatron import bootstrap, model
from nanscope.trace.observe import public_name

DIRECTIONS = ("forward", "backward")
VALUES = ("nan", "inf")
FORM = "MODULE:forward|backward:nan|inf, e.g. decoder.layers.0.mlp:forward:inf"


@dataclass(frozen=True)
class Fault:
    """A fault to plant. step: 1-based optimizer step it fires in (None: every step)."""

    module: str
    direction: str
    value: str
    step: int | None = None

    @property
    def spec(self) -> str:
        return f"{self.module}:{self.direction}:{self.value}"


def parse(text: str, step: int | None = None) -> Fault:
    """`MODULE:forward|backward:nan|inf` -> Fault; a malformed spec is one UserError line."""
    module, _, rest = text.rpartition(":")
    module, _, direction = module.rpartition(":")
    if not module or direction not in DIRECTIONS or rest not in VALUES:
        raise UserError(f"--fault {text!r}: expected {FORM}")
    if step is not None and step < 1:
        raise UserError(f"--fault-step {step}: expected a step >= 1")
    return Fault(module, direction, rest, step)


def names(root: torch.nn.Module, layer_offset: int = 0) -> list[str]:
    """Every module's public name on this stage, in named_modules() order (the root excluded)."""
    return [n for n in (public_name(p, layer_offset) for p, _ in root.named_modules()) if n]


class _Poison(torch.autograd.Function):
    """Identity forward; backward: the incoming gradient with its first entry replaced by `value` ("nan", "inf")."""

    @staticmethod
    def forward(ctx, x, value):
        ctx.value = value
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _with_first(grad, ctx.value), None


def _with_first(t: torch.Tensor, value: str) -> torch.Tensor:
    """`t` with its first entry replaced by `value` ("nan" or "inf")."""
    flat = t.reshape(-1)
    first = torch.zeros_like(flat, dtype=torch.bool)
    first[0] = True
    return torch.where(first, _made(value, flat), flat).view_as(t)


def _made(value: str, like: torch.Tensor) -> torch.Tensor:
    """The value computed from finite numbers, as a real overflow (max * 2) or 0 / 0 makes it: the tracer
    then names this op as the producer (a constant inf or NaN argument would count as an input)."""
    big = torch.full((), torch.finfo(torch.float32).max, device=like.device)
    made = big * 2 if value == "inf" else (big - big) / (big - big)
    return made.to(like.dtype)


def plant(root: torch.nn.Module, fault: Fault, layer_offset: int, active) -> list:
    """Plant `fault` in this stage's copy of the module, if it holds it; returns the hook handles.

    Args:
        root: this rank's model chunk (any wrapping).
        layer_offset: the stage's first global decoder layer.
        active: `active() -> bool`, whether the fault fires now (its step).

    Plant before any other forward hook (the sentinel's): hooks run in registration order, so the
    sentinel then sees the poisoned output.
    """
    value = fault.value

    def hook(module, args, output):
        if not active():
            return None
        first = output[0] if isinstance(output, tuple) else output
        poisoned = _with_first(first, value) if fault.direction == "forward" else _Poison.apply(first, value)
        return (poisoned, *output[1:]) if isinstance(output, tuple) else poisoned

    return [
        m.register_forward_hook(hook)
        for path, m in root.named_modules()
        if public_name(path, layer_offset) == fault.module
    ]


@cache
def module_names() -> tuple[str, ...]:
    """Every module of the harness model, by public name, in forward-definition order.

    Built in a child process (megatron's parallel state is process-global): one rank holding the whole
    model, so megatron's own layer indices are the global ones.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "nanscope.megatron.faults"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tuple(proc.stdout.split())


def check(fault: Fault) -> None:
    """A module the harness model does not have is one UserError line."""
    if fault.module not in module_names():
        raise UserError(
            f"--fault {fault.spec}: the harness model has no module {fault.module!r} "
            "(`nanscope repro --list-modules` lists them)"
        )


def main() -> int:
    """Print the harness model's module names, one a line."""
    bootstrap.init()
    ddp, _ = model.build_model(seed=0, bf16=False)
    print("\n".join(names(ddp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
