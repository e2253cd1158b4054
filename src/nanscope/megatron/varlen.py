"""Variable-length (THD) attention on CPU: megatron-core's local attention, one packed sequence at a time.

slime's `get_batch` packs every micro-batch as THD (backends/megatron_utils/data.py:37-60 at v0.1.0): the samples
concatenated into one row, padded to a multiple of 128, with `PackedSeqParams(qkv_format="thd", cu_seqlens)`.
megatron-core's local `DotProductAttention` refuses packed sequences (transformer/dot_product_attention.py:120);
TransformerEngine's flash attention, which slime runs on the GPUs, takes them. `VarlenDotProductAttention` is the
local attention that takes them: for each [cu_seqlens[i], cu_seqlens[i+1]) span (each sample, and the padding as
its own span) it runs megatron's own `DotProductAttention.forward` on that span alone, as a batch of one causal
sequence, and concatenates the results. That is what flash attention's varlen kernel computes: no position
attends across a sample boundary, the causal mask restarts at each sample, RoPE positions restart too (megatron's
`Attention` applies them per span from the same cu_seqlens before calling this).

    spec = varlen.layer_spec(config)   # the harness's local spec (model.layer_spec) with this attention

Shapes: Attention.forward squeezes the batch dim of a packed micro-batch, so query is [t, np, hn] and key/value
[t, ng, hn] (t = cu_seqlens[-1], np/ng heads/query groups of this tensor-parallel rank); the result is
[t, 1, np * hn], which Attention reshapes to [t, 1, hp] as it does for TransformerEngine's.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention

from nanscope.megatron import model


class VarlenDotProductAttention(DotProductAttention):
    """megatron's local attention, applied to each span of a THD-packed micro-batch on its own."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is None:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type=attn_mask_type, attention_bias=attention_bias
            )
        assert packed_seq_params.qkv_format == "thd", packed_seq_params.qkv_format
        assert attention_mask is None, "a packed micro-batch is causal within each span; no mask is passed"
        cu_q = packed_seq_params.cu_seqlens_q.tolist()
        cu_kv = packed_seq_params.cu_seqlens_kv.tolist()
        assert cu_q == cu_kv and cu_q[-1] == query.size(0), f"cu_seqlens {cu_q} / {cu_kv} for {query.size(0)} tokens"
        spans = []
        for start, end in zip(cu_q[:-1], cu_q[1:]):
            # [L, np, hn] -> [L, b=1, np, hn]: one causal sequence for megatron's own attention
            q, k, v = (x[start:end].unsqueeze(1) for x in (query, key, value))
            spans.append(super().forward(q, k, v, None, attn_mask_type=attn_mask_type, attention_bias=attention_bias))
        return torch.cat(spans, dim=0)  # [t, 1, hp]


def layer_spec(config):
    """The harness's local block spec (`model.layer_spec`: SequenceParallelRMSNorm) with `VarlenDotProductAttention`."""
    block = model.layer_spec(config)
    for spec in block.layer_specs:  # one ModuleSpec object, repeated per layer
        spec.submodules.self_attention.submodules.core_attention = VarlenDotProductAttention
    return block
