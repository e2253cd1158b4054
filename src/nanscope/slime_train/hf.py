"""The tiny Qwen3-MoE's Hugging Face directory, written locally: config.json and a word-level tokenizer.

slime reads `--hf-checkpoint` three times in a training run: `AutoConfig` in its argument parser, checked against the
Megatron flags by `hf_validate_args` (utils/arguments.py:885-887, :1039-1054: hidden size, heads, layers, FFN size,
tied embeddings, norm epsilon, rope theta), and `AutoConfig` plus `AutoTokenizer` in each actor (actor.py:51-52);
Megatron's tokenizer (`--tokenizer-type HuggingFaceTokenizer`, slime's default) loads it too. No weights are read
from it: the weights are the torch_dist checkpoint (`prepare.py`).

The config is Qwen3-MoE's (`model_type` qwen3_moe) at the harness's sizes (`nanscope.megatron.sizes.TinyQwen3MoE`).
The tokenizer maps `vocab_size` words to ids: id 0 `<|endoftext|>` (eos and pad, as slime pads with 0), then
`t1` ... `t{V-1}`; the rollout is token ids, so the words are never read.
"""

from __future__ import annotations

import json
from pathlib import Path

from nanscope.megatron.sizes import TinyQwen3MoE

EOS = "<|endoftext|>"


def config(sizes: TinyQwen3MoE) -> dict:
    """config.json of a Qwen3-MoE (transformers' Qwen3MoeConfig fields) at `sizes`."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": sizes.hidden_size,
        "intermediate_size": sizes.ffn_hidden_size,
        "num_hidden_layers": sizes.num_layers,
        "num_attention_heads": sizes.num_attention_heads,
        "num_key_value_heads": sizes.num_query_groups,
        "head_dim": sizes.kv_channels,
        "moe_intermediate_size": sizes.moe_ffn_hidden_size,
        "num_experts": sizes.num_experts,
        "num_experts_per_tok": sizes.moe_router_topk,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "rms_norm_eps": sizes.norm_epsilon,
        "rope_theta": sizes.rotary_base,
        "vocab_size": sizes.vocab_size,
        "max_position_embeddings": sizes.max_sequence_length,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 0,
    }


def tokenizer(vocab_size: int) -> dict:
    """tokenizer.json of a word-level tokenizer (Hugging Face `tokenizers`' format, version 1.0): whitespace-split
    words `t1` ... `t{V-1}`, id 0 `<|endoftext|>` (also what an unknown word maps to)."""
    vocab = {EOS: 0} | {f"t{i}": i for i in range(1, vocab_size)}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": EOS},
    }  # fmt: skip


def write(path: str | Path, sizes: TinyQwen3MoE = TinyQwen3MoE()) -> Path:
    """Write config.json, tokenizer.json and tokenizer_config.json under `path`; returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config(sizes), indent=1))
    (path / "tokenizer.json").write_text(json.dumps(tokenizer(sizes.vocab_size)))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": EOS,
        "model_max_length": sizes.max_sequence_length,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(settings, indent=1))
    return path
