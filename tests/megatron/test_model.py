"""Model pieces that run without a process group."""

from types import SimpleNamespace

import torch

from nanscope.megatron.model import OUTPUT_INIT_STD, SequenceParallelRMSNorm, TinyQwen3MoE


def test_sequence_parallel_norm_matches_torch_rmsnorm_and_marks_its_weight():
    config = SimpleNamespace(params_dtype=torch.float32, sequence_parallel=True)
    norm = SequenceParallelRMSNorm(config, 16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    ref = torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(norm.weight)
    x = torch.randn(5, 2, 16)
    torch.testing.assert_close(norm(x), ref(x))
    # finalize_model_grads all-reduces grads of params marked sequence_parallel over TP.
    assert norm.weight.sequence_parallel is True
    off = SequenceParallelRMSNorm(SimpleNamespace(params_dtype=torch.bfloat16, sequence_parallel=False), 4)
    assert off.weight.sequence_parallel is False and off.weight.dtype == torch.bfloat16


def test_tiny_model_keeps_the_case_features_at_laptop_scale():
    s = TinyQwen3MoE()
    assert (s.num_query_groups, s.num_experts, s.moe_router_topk) == (4, 8, 2)
    assert s.num_attention_heads * s.kv_channels != s.hidden_size  # Qwen3: heads x kv_channels != hidden
    assert s.num_layers >= 4 and 64 <= s.hidden_size <= 128 and s.vocab_size >= 512
    # Output logits have std ~ OUTPUT_INIT_STD (unit-RMS hidden state): +-3 std spans ~6 * 16 = 96
    # units, so at temperature 0.8 the least likely of 512 tokens sits below logp -88.72.
    assert OUTPUT_INIT_STD * 6 / 0.8 > 88.72 + 10
