"""What a non-finite step showed, in public names: the helpers the harness and the plugin share, written once.

    layer_offset(chunks)       the global index of this stage's first decoder layer
    public_name(path, offset)  a module path as megatron's named_modules() gives it -> the public name:
                               wrappers (DDP, Float16Module: `module.module.`) stripped, decoder layers global
    public_hit / public_producer   a sentinel finding with public names
    nonfinite_counts(batches)  (non-finite entries, entries) of each loss input the loss received
    causal_order(...)          which rank's finding came first, when several ranks saw a non-finite value

Public names are what `nanscope repro --fault` and `--list-modules` write, and what every report says.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from nanscope.facts.keys import PER_TOKEN

_LAYER = re.compile(r"^decoder\.layers\.(\d+)(\..+)?$")
_WRAPPERS = re.compile(r"^(module\.)+")  # DDP(Float16Module(GPTModel)) prefixes


def layer_offset(chunks) -> int:
    """The global index of the first chunk's first decoder layer.

    megatron's `layer_number` is 1-based and global; module paths number a stage's layers from 0.
    """
    for module in chunks[0].modules():
        if isinstance(getattr(module, "layer_number", None), int):
            return module.layer_number - 1
    return 0


def public_name(path: str, offset: int = 0) -> str:
    """A named_modules() path of this stage -> the public name: wrappers stripped, decoder layer global."""
    name = _WRAPPERS.sub("", path + ".")[:-1]
    match = _LAYER.match(name)
    return name if match is None else f"decoder.layers.{int(match[1]) + offset}{match[2] or ''}"


def public_hit(hit, offset: int):
    """A sentinel Hit with public module and parameter names (None stays None)."""
    if hit is None:
        return None
    param = None if hit.param is None else public_name(hit.param, offset)
    return dataclasses.replace(hit, module=public_name(hit.module, offset), param=param)


def public_producer(producer, offset: int):
    """A sentinel Producer with public module names (None stays None)."""
    if producer is None:
        return None
    module = None if producer.module is None else public_name(producer.module, offset)
    return dataclasses.replace(producer, module=module, seen_at=public_name(producer.seen_at, offset))


def nonfinite_counts(batches: Iterable[dict], keys: tuple[str, ...] = PER_TOKEN) -> dict[str, tuple[int, int]]:
    """(non-finite entries, entries) of each key any of `batches` holds, over all of them (one host sync a key).

    Args:
        batches: slime micro-batches (per-sample lists of tensors under each key).
    """
    import torch  # heavy: the module's names are read by torch-free code

    per_key: dict[str, list] = {}
    for batch in batches:
        for key in keys:
            per_key.setdefault(key, []).extend(torch.as_tensor(x) for x in batch.get(key) or [])
    return {
        key: (sum(int((~torch.isfinite(x)).sum()) for x in tensors), sum(x.numel() for x in tensors))
        for key, tensors in per_key.items()
        if tensors
    }


def causal_order(*, rank: int, pp: int, forward: bool, producer: dict | None = None, order: int | None = None) -> tuple:
    """Sort key of one rank's finding, first in causal order first.

    A forward finding on the earliest pipeline stage (the forward runs stage 0 first), within a stage the
    earliest in its forward (`order`: the index of its forward check in the step, when known), else the latest
    stage with a finding (the backward starts at the loss and runs back to stage 0), and within a stage the
    earliest in its backward (the producer's micro-batch, then the index of its output-gradient check, when
    known): a tensor-parallel peer that received the value through a collective sees it later than the rank
    that made it.
    """
    if forward:
        return (0, pp, order if order is not None else 1 << 30, rank)
    when = (producer["microbatch"], producer["order"]) if producer else (1 << 30, 1 << 30)
    return (1, -pp, *when, rank)
