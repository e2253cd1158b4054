"""A toy MoE stage named and called like megatron-core's (decoder.layers.L.mlp.{router, experts.local_experts.E}):
TopKRouter's gating / routing and (probs, routing_map) output, MoELayer's local_expert_indices, the experts called
with (tokens, tokens_per_expert, probs) as moe_layer.py:224 does. For the CPU tests of the sentinel's expert counts
and the zero-token fault, without torchrun."""

import torch

EXPERTS, TOPK, HIDDEN = 4, 2, 4


class Router(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(EXPERTS, HIDDEN))

    def gating(self, x):
        return x @ self.weight.t()

    def routing(self, logits):
        top = logits.topk(TOPK, dim=-1).indices
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top, True)
        return torch.softmax(logits, dim=-1) * routing_map, routing_map

    def forward(self, x):
        return self.routing(self.gating(x))


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.local_experts = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(EXPERTS))

    def forward(self, tokens, tokens_per_expert, probs):
        parts = torch.split(tokens, tokens_per_expert.tolist())
        return torch.cat([expert(part) for expert, part in zip(self.local_experts, parts)]) * probs[:, None], None


class MoELayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router, self.experts = Router(), Experts()
        self.local_expert_indices = list(range(EXPERTS))

    def forward(self, x):
        probs, routing_map = self.router(x)
        rows = [routing_map[:, e].nonzero().flatten() for e in range(EXPERTS)]
        index = torch.cat(rows)
        weights = torch.cat([probs[r, e] for e, r in enumerate(rows)])
        out, _ = self.experts(x[index], routing_map.sum(0), weights)
        return torch.zeros_like(x).index_add(0, index, out), None


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = MoELayer()

    def forward(self, x):
        return x + self.mlp(x)[0]


class Stage(torch.nn.Module):
    """decoder.layers.{0,1} of MoE layers and an output layer, wrapped once as DDP wraps a chunk (module.)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        inner = torch.nn.Module()
        inner.decoder = torch.nn.Module()
        inner.decoder.layers = torch.nn.ModuleList(Layer() for _ in range(2))
        inner.output_layer = torch.nn.Linear(HIDDEN, 2)
        self.module = inner

    def forward(self, x):
        for layer in self.module.decoder.layers:
            x = layer(x)
        return self.module.output_layer(x)
