"""VarlenDotProductAttention: megatron's local attention over a THD-packed micro-batch, one span at a time, equal to
an fp64 causal attention computed per sample (no position attends across a sample boundary)."""

from types import SimpleNamespace

import pytest
import torch

from nanscope.megatron import cpu


@pytest.fixture
def attention():
    cpu.install()  # the local attention's default causal mask is built with device="cuda"
    from megatron.core import parallel_state, tensor_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("model-parallel-rng", 1234)  # the attention's dropout forks it (at dropout 0: nothing drawn)
    had_buffer = parallel_state._GLOBAL_MEMORY_BUFFER is not None
    if not had_buffer:  # the local attention's score buffer (no process group needed)
        parallel_state._set_global_memory_buffer()
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.enums import AttnMaskType

        from nanscope.megatron.varlen import VarlenDotProductAttention

        config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                                   kv_channels=8, attention_softmax_in_fp32=True, masked_softmax_fusion=False,
                                   attention_dropout=0.0)  # fmt: skip
        one_rank = SimpleNamespace(tp=SimpleNamespace(size=lambda: 1))  # what the attention reads of its groups
        module = VarlenDotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                           attention_type="self", model_comm_pgs=one_rank)  # fmt: skip
        yield module, PackedSeqParams
    finally:
        if not had_buffer:
            parallel_state._GLOBAL_MEMORY_BUFFER = None
        tracker.reset()
        cpu.uninstall()


def _reference(q, k, v, cu: list[int]) -> torch.Tensor:
    """fp64 causal softmax attention per span, GQA by repeating each query group's k and v: [t, np * hn]."""
    out = []
    groups = q.size(1) // k.size(1)
    for start, end in zip(cu[:-1], cu[1:]):
        qs, ks, vs = (x[start:end].double() for x in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, dim=1), vs.repeat_interleave(groups, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) / q.size(-1) ** 0.5
        n = end - start
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs).reshape(n, -1))
    return torch.cat(out)


def test_packed_spans_attend_within_themselves_only(attention):
    module, PackedSeqParams = attention
    g = torch.Generator().manual_seed(0)
    cu = [0, 5, 12, 13, 16]  # three samples (one of a single token) and the packing's padding span
    q, k, v = torch.randn(16, 4, 8, generator=g), torch.randn(16, 2, 8, generator=g), torch.randn(16, 2, 8, generator=g)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t, max_seqlen_q=7, max_seqlen_kv=7)
    out = module(q, k, v, None, packed_seq_params=packed)
    assert out.shape == (16, 1, 32)
    torch.testing.assert_close(out[:, 0].double(), _reference(q, k, v, cu), rtol=1e-5, atol=1e-6)
    # changing the second sample's keys and values leaves the others' outputs as they were
    k2, v2 = k.clone(), v.clone()
    k2[5:12], v2[5:12] = 100.0, -100.0
    again = module(q, k2, v2, None, packed_seq_params=packed)
    torch.testing.assert_close(again[:5], out[:5], rtol=0, atol=0)
    torch.testing.assert_close(again[12:], out[12:], rtol=0, atol=0)


def test_an_unpacked_batch_is_megatrons_own_local_attention(attention):
    module, _ = attention
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(6, 1, 4, 8, generator=g),
        torch.randn(6, 1, 2, 8, generator=g),
        torch.randn(6, 1, 2, 8, generator=g),
    )
    out = module(q, k, v, None)
    torch.testing.assert_close(out[:, 0].double(), _reference(q[:, 0], k[:, 0], v[:, 0], [0, 6]), rtol=1e-5, atol=1e-6)
