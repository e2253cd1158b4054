"""The tiny Qwen3-MoE's sizes, torch-free: what a launch script or a CLI names without importing the model
(`nanscope.megatron.model` builds it; `slime_train.flags` and the shipped harness launch script name them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyQwen3MoE:
    """Sizes of the tiny model (the case's value in comments)."""

    num_layers: int = 4  # 94
    hidden_size: int = 64  # 4096
    num_attention_heads: int = 8  # 64
    num_query_groups: int = 4  # 4
    kv_channels: int = 16  # 128 (heads * kv_channels != hidden, as in Qwen3)
    ffn_hidden_size: int = 128  # 12288 (unused: every layer is MoE)
    moe_ffn_hidden_size: int = 32  # 1536
    num_experts: int = 8  # 128
    moe_router_topk: int = 2  # 8
    vocab_size: int = 512  # 151936
    max_sequence_length: int = 512  # 262144
    norm_epsilon: float = 1e-6  # 1e-6
    rotary_base: int = 1_000_000  # Qwen3's rope theta
