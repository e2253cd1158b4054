"""Public names over a virtual pipeline's chunks: each chunk's decoder layers numbered from its own first layer."""

import torch

from nanscope.slime_plugin.names import PublicNames
from nanscope.trace.sentinels.reading import Hit


class Layer(torch.nn.Module):
    def __init__(self, number: int):
        super().__init__()
        self.layer_number = number  # megatron's: 1-based, global
        self.mlp = torch.nn.Linear(2, 2)


def chunk(first: int) -> torch.nn.Module:
    decoder = torch.nn.Module()
    decoder.layers = torch.nn.ModuleList([Layer(first)])
    root = torch.nn.Module()
    root.decoder = decoder
    return root


def test_each_chunk_keeps_its_own_layer_offset():
    # stage 0 of PP 2 with 2 virtual stages of one layer: chunk 0 holds layer 0, chunk 1 holds layer 2
    names = PublicNames([chunk(1), chunk(3)])
    assert names.name("chunk0.module.module.decoder.layers.0.mlp") == "decoder.layers.0.mlp"
    assert names.name("chunk1.module.module.decoder.layers.0.mlp") == "decoder.layers.2.mlp"
    hit = names.hit(Hit("chunk1.decoder.layers.0.mlp", 3, 9, "chunk1.decoder.layers.0.mlp.weight"))
    assert (hit.module, hit.param, hit.microbatch) == ("decoder.layers.2.mlp", "decoder.layers.2.mlp.weight", 3)
    one = PublicNames([chunk(3)])  # one chunk: no prefix, its offset
    assert one.name("module.decoder.layers.0.mlp") == "decoder.layers.2.mlp" and one.hit(None) is None
