"""Faults planted in the harness model: `MODULE:forward|backward:nan|inf`, in any module, at one step.

    nanscope repro --fault decoder.layers.0.mlp:forward:inf --fault-step 1
    nanscope repro --list-modules          # python -m nanscope.megatron.faults: the same list

MODULE is a module path as megatron names it inside GPTModel (`decoder.layers.1.mlp.router`,
`output_layer`), with the decoder layer index global: megatron numbers a pipeline stage's layers from 0,
so the harness maps `decoder.layers.G` to the stage that holds layer G and its local index there.

forward: the module's output gets one non-finite entry (its first; a router's first routed prob), standing in
for an activation past the format's max or a kernel reading uninitialised memory. backward: the gradient arriving at the
module's output gets one non-finite entry (a router's: at its first routed prob) before the module's own backward runs, so the module's
parameter gradients are the first non-finite ones while its inputs and outputs stay finite: a kernel
bug in its backward. zero-tokens (an expert only): no token is routed to that expert and its weight gradient is
uninitialised memory holding the value, as a grouped GEMM leaves an empty group's (megatron.zero_tokens).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from functools import cache

import torch

from nanscope.errors import UserError
from nanscope.megatron import bootstrap, model, zero_tokens
from nanscope.trace.sentinels.observe import public_name

DIRECTIONS = ("forward", "backward", zero_tokens.DIRECTION)
VALUES = ("nan", "inf")
FORM = (
    "MODULE:forward|backward:nan|inf, e.g. decoder.layers.0.mlp:forward:inf, or EXPERT:zero-tokens:nan|inf, "
    "e.g. decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan"
)


@dataclass(frozen=True)
class Fault:
    """A fault to plant. step: 1-based optimizer step it fires in (None: every step)."""

    module: str
    direction: str
    value: str
    step: int | None = None
    once: bool = False  # fires on the module's first training call only (a transient fault: a rerun is clean)

    @property
    def spec(self) -> str:
        return f"{self.module}:{self.direction}:{self.value}"


def parse(text: str, step: int | None = None, once: bool = False) -> Fault:
    """`MODULE:forward|backward:nan|inf` -> Fault; a malformed spec is one UserError line."""
    module, _, rest = text.rpartition(":")
    module, _, direction = module.rpartition(":")
    if not module or direction not in DIRECTIONS or rest not in VALUES:
        raise UserError(f"--fault {text!r}: expected {FORM}")
    if step is not None and step < 1:
        raise UserError(f"--fault-step {step}: expected a step >= 1")
    if direction == zero_tokens.DIRECTION:
        zero_tokens.check(module)
    return Fault(module, direction, rest, step, once)


def names(root: torch.nn.Module, layer_offset: int = 0) -> list[str]:
    """Every module's public name on this stage, in named_modules() order (the root excluded)."""
    return [n for n in (public_name(p, layer_offset) for p, _ in root.named_modules()) if n]


class _Poison(torch.autograd.Function):
    """Identity forward; backward: the incoming gradient with its first entry replaced by `value` ("nan", "inf"), or,
    given a router's routing map, its first routed entry."""

    @staticmethod
    def forward(ctx, x, value, routed):
        ctx.value, ctx.routed = value, routed
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.routed is not None:
            return _with_first_routed(grad, ctx.routed, ctx.value), None, None
        return _with_first(grad, ctx.value), None, None


def _with_first(t: torch.Tensor, value: str) -> torch.Tensor:
    """`t` with its first entry replaced by `value` ("nan" or "inf")."""
    flat = t.reshape(-1)
    first = torch.zeros_like(flat, dtype=torch.bool)
    first[0] = True
    return torch.where(first, _made(value, flat), flat).view_as(t)


def _with_first_routed(probs: torch.Tensor, routing_map: torch.Tensor, value: str) -> torch.Tensor:
    """A router's probs (or their gradient) with the first routed entry (the first True of the routing map) replaced by
    `value`: an unrouted prob is never read, so poisoning entry 0 could leave the step finite."""
    flat, routed = probs.reshape(-1), routing_map.reshape(-1)
    first = routed & (routed.cumsum(0) == 1)
    return torch.where(first, _made(value, flat), flat).view_as(probs)


def _poisoned(output, value: str, direction: str):
    """A module's output with the fault applied to its first tensor (a router's: its first routed prob)."""
    first = output[0] if isinstance(output, tuple) else output
    rest = output[1:] if isinstance(output, tuple) else ()
    routed = None  # (probs, routing_map) of megatron's TopKRouter: an unrouted prob is never read, nor its gradient
    if rest and isinstance(rest[0], torch.Tensor) and rest[0].dtype == torch.bool and rest[0].shape == first.shape:
        routed = rest[0]
    if direction == "backward":
        first = _Poison.apply(first, value, routed)
    else:
        first = _with_first(first, value) if routed is None else _with_first_routed(first, routed, value)
    return (first, *rest) if isinstance(output, tuple) else first


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
        active: `active() -> bool`, whether the fault fires now (its step); a `once` fault fires on the
            first call it is active for, and never again.

    Plant before any other forward hook (the sentinel's): hooks run in registration order, so the
    sentinel then sees the poisoned output.
    """
    if fault.direction == zero_tokens.DIRECTION:
        return zero_tokens.plant(root, fault.module, fault.value, layer_offset, active)
    fired = [False]  # this planting's: a `once` fault has fired

    def hook(module, args, output):
        # a `once` fault strikes the training pass (module.training): the log-prob pass before it stays clean
        if not active() or (fault.once and (fired[0] or not module.training)):
            return None
        fired[0] = True
        return _poisoned(output, fault.value, fault.direction)

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
