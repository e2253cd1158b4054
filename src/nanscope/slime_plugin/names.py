"""Public names over several model chunks: what the sentinel calls `chunk<i>.<path>`, as reports name it.

The sentinel prefixes `chunk<i>.` to module paths when it watches more than one chunk (a virtual pipeline:
megatron builds one chunk per virtual stage, each numbering its decoder layers from 0). Each chunk's layers
start at their own global layer (`layer_offset([chunk])`), so a path is made public with its own chunk's
offset (`trace.sentinels.observe.public_name`), and the prefix is dropped: `chunk1.module.module.decoder.layers.0.mlp`
on pipeline stage 0 of 2 with 2 virtual stages of 1 layer is `decoder.layers.2.mlp`.
"""

from __future__ import annotations

import dataclasses
import re

from nanscope.trace.sentinels.observe import layer_offset, public_name

_CHUNK = re.compile(r"^chunk(\d+)\.")


class PublicNames:
    """The public name of a sentinel path of these chunks."""

    def __init__(self, chunks):
        self.offsets = [layer_offset([chunk]) for chunk in chunks]
        self.many = len(self.offsets) > 1

    @property
    def offset(self) -> int:
        """The first chunk's (what a one-chunk stage's names use)."""
        return self.offsets[0]

    def name(self, path: str) -> str:
        match = _CHUNK.match(path) if self.many else None
        if match is None:
            return public_name(path, self.offsets[0])
        return public_name(path[match.end() :], self.offsets[int(match[1])])

    def hit(self, hit):
        """A sentinel Hit in public names (None stays None)."""
        if hit is None:
            return None
        param = None if hit.param is None else self.name(hit.param)
        return dataclasses.replace(hit, module=self.name(hit.module), param=param)
