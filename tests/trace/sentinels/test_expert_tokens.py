"""The sentinel's per-expert token counts (trace.sentinels.expert_tokens, trace.sentinels.expert_counts) on a toy MoE
stage, and the zero-token expert planted in it (megatron.zero_tokens): CPU, no torchrun."""

import torch

from nanscope.megatron import faults
from nanscope.trace.sentinels.expert_counts import public
from nanscope.trace.sentinels.sentinel import Sentinel
from tests.trace.moe_toy import EXPERTS, TOPK, Stage

TOKENS = 16
ZERO = "decoder.layers.1.mlp.experts.local_experts.2:zero-tokens:nan"


def _step(stage, microbatches=2):
    for mb in range(microbatches):
        torch.manual_seed(10 + mb)
        stage(torch.randn(TOKENS, 4)).sum().backward()


def test_a_healthy_step_keeps_only_a_count_and_a_bad_one_the_failing_micro_batch_s_counts():
    stage = Stage()
    sentinel = Sentinel([stage])
    _step(stage)
    reading = sentinel.read(grads=True)
    assert reading.finite and reading.experts == {"kept": 4}  # 2 layers x 2 micro-batches, nothing copied
    handles = faults.plant(stage, faults.parse(ZERO), 0, lambda: True)
    _step(stage)
    reading = sentinel.read(grads=True)
    assert not reading.finite and reading.backward.param.endswith("local_experts.2.weight")
    doc = reading.expert_tokens(offset=0)
    assert doc["microbatch"] == reading.backward.microbatch == 0
    layer1 = doc["layers"][1]
    assert layer1["layer"] == "decoder.layers.1.mlp" and layer1["experts"] == list(range(EXPERTS))
    assert layer1["routed"] == layer1["received"] and layer1["received"][2] == 0 and layer1["zero"] == [2]
    assert sum(layer1["received"]) == TOKENS * TOPK
    assert doc["layers"][0]["zero"] == []
    assert doc["finding"] == (
        "expert 2 of layer 1 received 0 tokens, and its weight gradient is the first non-finite one "
        "(decoder.layers.1.mlp.experts.local_experts.2.weight)"
    )
    for handle in handles:
        handle.remove()
    sentinel.remove()


def test_the_zero_token_fault_unroutes_the_expert_and_leaves_every_other_value_as_it_was():
    clean, planted = Stage(), Stage()
    handles = faults.plant(planted, faults.parse(ZERO), 0, lambda: True)
    torch.manual_seed(1)
    x = torch.randn(TOKENS, 4)
    _, routing_map = planted.module.decoder.layers[1].mlp.router(x)
    assert not routing_map[:, 2].any()  # never in a token's top-k
    out = planted(x)
    out.sum().backward()
    assert torch.isfinite(out).all()  # the forward: an expert with 0 rows
    grads = {n: p.grad for n, p in planted.named_parameters()}
    assert torch.isnan(grads["module.decoder.layers.1.mlp.experts.local_experts.2.weight"]).all()
    bad = [n for n, g in grads.items() if not torch.isfinite(g).all()]
    assert bad == ["module.decoder.layers.1.mlp.experts.local_experts.2.weight"]
    for handle in handles:
        handle.remove()
    _, routing_map = planted.module.decoder.layers[1].mlp.router(x)
    assert torch.equal(routing_map, clean.module.decoder.layers[1].mlp.router(x)[1])  # removed: as built


def test_an_expert_with_tokens_keeps_its_gradient_while_the_fault_is_inactive():
    stage = Stage()
    faults.plant(stage, faults.parse(ZERO), 0, lambda: False)
    _step(stage)
    assert all(torch.isfinite(p.grad).all() for p in stage.parameters())


def test_public_counts_name_layers_globally_and_find_nothing_without_a_zero_token_weight():
    doc = {"microbatch": 1, "layers": [{"layer": "module.decoder.layers.0.mlp", "routed": [3, 1], "experts": [4, 5],
                                        "received": [0, 2]}]}  # fmt: skip
    seen = public(doc, 2, "module.decoder.layers.0.mlp.experts.linear_fc1.weight0")  # TEGroupedMLP's weight<i>
    assert seen["layers"][0]["layer"] == "decoder.layers.2.mlp" and seen["layers"][0]["zero"] == [4]
    assert seen["finding"] == (
        "expert 4 of layer 2 received 0 tokens, and its weight gradient is the first non-finite one "
        "(decoder.layers.2.mlp.experts.linear_fc1.weight0)"
    )
    assert public(doc, 2, "module.decoder.layers.0.mlp.experts.linear_fc1.weight1")["finding"] is None  # 2 tokens
    assert public(doc, 2, "module.decoder.layers.0.self_attention.linear_qkv.weight")["finding"] is None
    assert public({"kept": 3}, 0) == {"kept": 3} and public(None, 0) is None
