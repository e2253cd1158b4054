"""The per-expert token counts of a non-finite step, as reports write them: public names, and the zero-token verdict.

Torch-free: `Reading.expert_tokens(offset)` calls `public` on what `expert_tokens.ExpertTokens.read` kept.

    public(doc, offset, first_param)
    -> {"microbatch", "layers": [{"layer", "routed", "experts", "received", "zero"}], "finding"}

`finding` is the discriminator of catalogue.MOE_ZERO_TOKEN_EXPERT when it holds: "expert e of layer l received 0
tokens, and its weight gradient is the first non-finite one", else None. The expert of a parameter is read from
its name: `...experts.local_experts.<i>.` (SequentialMLP) or `...experts.linear_fc1.weight<i>` (TEGroupedMLP).
"""

from __future__ import annotations

import re

from nanscope.trace.sentinels.observe import public_name

_EXPERT = re.compile(r"^(?P<layer>.+)\.experts\.(?:local_experts\.(?P<seq>\d+)\.|linear_fc[12]\.weight(?P<te>\d+)$)")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def public(doc: dict | None, offset: int, first_param: str | None = None) -> dict | None:
    """`doc` (ExpertTokens.read, module paths) with public names, each layer's zero-token experts, and the finding.

    Args:
        doc: the counts of the failing micro-batch, or a healthy step's {"kept": n}, or None (not observed).
        offset: the stage's first global decoder layer (trace.sentinels.observe.layer_offset).
        first_param: the first non-finite parameter gradient in backward order (a module path), if any.
    """
    if doc is None or "layers" not in doc:
        return doc
    layers = []
    for layer in doc["layers"]:
        zero = [expert for expert, count in zip(layer["experts"], layer["received"]) if count == 0]
        layers.append({**layer, "layer": public_name(layer["layer"], offset), "zero": zero})
    param = None if first_param is None else public_name(first_param, offset)
    return {"microbatch": doc["microbatch"], "layers": layers, "finding": _finding(layers, param)}


def _finding(layers: list[dict], param: str | None) -> str | None:
    """The zero-token verdict when the first non-finite gradient is a weight of an expert that received 0 tokens."""
    match = None if param is None else _EXPERT.match(param)
    if match is None:
        return None
    local = int(match["seq"] if match["seq"] is not None else match["te"])
    for layer in layers:
        if layer["layer"] == match["layer"] and local < len(layer["received"]) and layer["received"][local] == 0:
            number = _LAYER.search(layer["layer"])
            where = f"layer {number[1]}" if number else layer["layer"]
            return (
                f"expert {layer['experts'][local]} of {where} received 0 tokens, and its weight gradient is the first "
                f"non-finite one ({param})"
            )
    return None
