"""The zero-token expert planted in the harness: `EXPERT:zero-tokens:nan|inf` (catalogue.MOE_ZERO_TOKEN_EXPERT).

    nanscope repro --hazard moe-zero-token-expert     # decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan

Two changes to one expert of one MoE layer, at the fault's step:

- no token picks it: the layer's router's logit for that expert is the dtype's lowest finite value, so it is never
  among a token's top-k (the router's `gating` is wrapped; routing, counts and dispatch follow as megatron computes
  them);
- its weight gradient is uninitialised memory: a grouped GEMM (torch._grouped_mm, MSLK, the legacy grouped_gemm)
  never writes the rows of an expert whose group is empty, and they hold what the allocator recycled. The harness's
  experts are megatron's SequentialMLP (the local spec; grouped GEMMs need CUDA), which gives an empty expert exact
  zeros (experts.py:1076-1089), so the NaN goes where the grouped GEMM's unwritten rows would be: each of the
  expert's weight gradients, in a micro-batch where it received 0 tokens, is a fresh allocation filled with the
  fault's value, as torch.empty is under torch.use_deterministic_algorithms(True) with
  torch.utils.deterministic.fill_uninitialized_memory (NaN), the poisoning kernels' own tests use.

The expert's forward (0 rows), its input gradient and every other gradient stay as megatron computes them.
"""

from __future__ import annotations

import re
from collections import deque

import torch

from nanscope.errors import UserError
from nanscope.trace.sentinels.observe import public_name

DIRECTION = "zero-tokens"
EXPERT = re.compile(r"^(?P<layer>decoder\.layers\.\d+\.mlp)\.experts\.local_experts\.(?P<local>\d+)$")


def check(module: str) -> None:
    """A zero-tokens fault names one expert of SequentialMLP; anything else is one UserError line."""
    if EXPERT.match(module) is None:
        raise UserError(
            f"--fault {module}:{DIRECTION}: expected an expert, decoder.layers.L.mlp.experts.local_experts.E"
        )


class _Unrouted:
    """The router's gating, wrapped: expert `expert`'s logit is the lowest finite value while `active()`."""

    def __init__(self, router: torch.nn.Module, expert: int, active):
        original = router.gating
        self.router = router

        def gating(input):
            logits = original(input)
            if not active():
                return logits
            column = torch.tensor([expert], device=logits.device)
            return logits.index_fill(-1, column, torch.finfo(logits.dtype).min)

        router.gating = gating

    def remove(self) -> None:
        vars(self.router).pop("gating", None)


class _Unwritten:
    """The expert's weight gradients, as a grouped GEMM with uninitialised buffers leaves an empty group's."""

    def __init__(self, layer: torch.nn.Module, local: int, value: str, active):
        expert = layer.experts.local_experts[local]
        params = [param for name, param in expert.named_parameters() if name.endswith("weight")]
        self.pending = [deque() for _ in params]  # per weight: this expert's token count of each forward, in order
        self.value = float(value)
        self._handles = [layer.experts.register_forward_pre_hook(self._received(local))]
        self._handles += [
            param.register_hook(self._poison(queue, active)) for param, queue in zip(params, self.pending)
        ]

    def _received(self, local: int):
        def hook(module, args):
            if module.training and torch.is_grad_enabled():  # a training forward: its backward follows, in order
                count = int(args[1][local])
                for queue in self.pending:
                    queue.append(count)

        return hook

    def _poison(self, queue: deque, active):
        def hook(grad):
            count = queue.popleft() if queue else None
            if count != 0 or not active():
                return None
            return torch.empty_like(grad).fill_(self.value)  # the allocator's recycled rows, poisoned

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def plant(root: torch.nn.Module, module: str, value: str, layer_offset: int, active) -> list:
    """Plant the zero-token expert `module` (public name) in this stage, if it holds that layer; returns the handles.

    Args:
        root: this rank's model chunk (any wrapping).
        value: "nan" or "inf", what the unwritten rows hold.
        layer_offset: the stage's first global decoder layer.
        active: `active() -> bool`, whether the fault fires now (its step).
    """
    match = EXPERT.match(module)
    handles = []
    for path, layer in root.named_modules():
        if match is not None and public_name(path, layer_offset) == match["layer"]:
            local = int(match["local"])
            handles.append(_Unrouted(layer.router, layer.local_expert_indices[local], active))
            handles.append(_Unwritten(layer, local, value, active))
    return handles
