"""The sentinel's MoE side: each MoE layer's per-expert token counts, per training micro-batch, kept on the device.

megatron-core's TopKRouter returns `(probs, routing_map)`, routing_map a bool [tokens, experts] over this rank's
tokens (router.py:469-471; moe_utils.py:593); the experts module receives `tokens_per_expert`, what each local
expert got after the dispatcher (moe_layer.py:224). A forward hook keeps `routing_map.sum(0)` of each router and a
pre-hook the experts' `tokens_per_expert`, per micro-batch of the layer's model chunk (the chunk's training forwards
so far this step; a second call for the same micro-batch, an activation recompute, is not counted again). Nothing
is copied to the host: on a healthy step the reading holds only how many (layer, micro-batch) counts it kept; on a
non-finite one, those of the failing micro-batch (`Sentinel.read`).

    tokens = ExpertTokens(model_chunks)     # the Sentinel makes one
    ... forward / backward ...
    tokens.read(microbatch)                 # {"microbatch", "layers": [...]} in module paths (expert_counts)
    tokens.clear()
"""

from __future__ import annotations

import torch


def _moe_layers(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(path, module) of each MoE layer: a module with a `router` that routes and `experts` (megatron's MoELayer)."""
    found = []
    for path, module in root.named_modules():
        router, experts = getattr(module, "router", None), getattr(module, "experts", None)
        if isinstance(router, torch.nn.Module) and isinstance(experts, torch.nn.Module) and hasattr(router, "routing"):
            found.append((path, module))
    return found


class ExpertTokens:
    """Per-expert token counts of every MoE layer in some model chunks (see the module docstring)."""

    def __init__(self, roots):
        self.layers: list[tuple[str, list[int]]] = []  # (path, the global indices of its local experts)
        self.routed: dict[tuple[int, int], torch.Tensor] = {}  # (layer, micro-batch) -> routing_map.sum(0)
        self.received: dict[tuple[int, int], torch.Tensor] = {}  # (layer, micro-batch) -> tokens_per_expert
        self._microbatch = [-1] * len(roots)
        self._handles = []
        for chunk, root in enumerate(roots):
            self._handles.append(root.register_forward_pre_hook(self._starts(chunk)))
            for path, layer in _moe_layers(root):
                index = len(self.layers)
                local = getattr(layer, "local_expert_indices", None)
                self.layers.append((path, list(local) if local is not None else []))
                self._handles.append(layer.router.register_forward_hook(self._routed(index, chunk)))
                self._handles.append(layer.experts.register_forward_pre_hook(self._received(index, chunk)))

    def _starts(self, chunk: int):
        def hook(module, args):
            if module.training:
                self._microbatch[chunk] += 1

        return hook

    def _routed(self, index: int, chunk: int):
        def hook(module, args, output):
            key = (index, self._microbatch[chunk])
            routing_map = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            if module.training and key not in self.routed and isinstance(routing_map, torch.Tensor):
                self.routed[key] = routing_map.detach().sum(dim=0)  # one small kernel, no host sync

        return hook

    def _received(self, index: int, chunk: int):
        def hook(module, args):
            key = (index, self._microbatch[chunk])
            counts = args[1] if len(args) > 1 else None
            if module.training and key not in self.received and isinstance(counts, torch.Tensor):
                self.received[key] = counts.detach().clone()

        return hook

    @property
    def kept(self) -> int:
        """How many (layer, micro-batch) counts this step kept: all a healthy step's reading says."""
        return len(self.routed)

    def read(self, microbatch: int | None) -> dict:
        """The counts of one micro-batch on every MoE layer, in module paths (one host copy: a bad step only).

        Returns:
            {"microbatch", "layers": [{"layer", "routed", "experts", "received"}]}: routed, this rank's tokens per
            expert (all experts); experts, the global indices of the layer's local experts; received, their tokens.
        """
        layers = []
        for index, (path, local) in enumerate(self.layers):
            routed, received = self.routed.get((index, microbatch)), self.received.get((index, microbatch))
            if routed is None and received is None:
                continue
            counts = [] if received is None else [int(c) for c in received.tolist()]
            layers.append(
                {
                    "layer": path,
                    "routed": [] if routed is None else [int(c) for c in routed.tolist()],
                    "experts": local if len(local) == len(counts) else list(range(len(counts))),
                    "received": counts,
                }
            )
        return {"microbatch": microbatch, "layers": layers}

    def clear(self) -> None:
        """A new step: no counts, micro-batches from 0."""
        self.routed.clear()
        self.received.clear()
        self._microbatch = [-1] * len(self._microbatch)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
