"""How much a dump may make nanscope read, allocate and compute, whatever the file declares.

Three bounds: the file's size (`Limits.max_bytes`, --max-dump-mb), what its pickle builds while it is read
(8 bytes a byte of the file + 32 MiB, `nanscope.trace.loading.pickle_budget`, shared with every torch.save reader),
and the entries converted from it (`Budget`, one a byte, and `Limits.max_sample_tokens` a field).

No torch or numpy here: the CLI takes its defaults and --help from this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.errors import UserError
from nanscope.inputs import MiB

MAX_DUMP_MB = 2048  # --max-dump-mb: 4x a case-sized rollout of full-length responses as lists
MAX_SAMPLE_TOKENS = 1 << 22  # --max-sample-tokens: 64x the case's 65,536-token context
SAMPLE_COST = 16  # budget entries charged per sample: a sample takes at least this many bytes of the file


@dataclass(frozen=True)
class Limits:
    """What a dump may make nanscope read and allocate, whatever the file declares.

    Attributes:
        max_bytes: the largest file read (--max-dump-mb).
        max_sample_tokens: the most entries one field of one sample may hold, and the largest
            response_length it may declare (--max-sample-tokens).
    """

    max_bytes: int = MAX_DUMP_MB * MiB
    max_sample_tokens: int = MAX_SAMPLE_TOKENS


class Budget:
    """Entries converted over the whole file, at most one per byte of the file.

    Every per-token entry takes at least one byte of the file (a list element two, a tensor element one),
    so only shared references (one list or storage named by many samples) can exceed it; they would make
    a small file cost unbounded time and memory.
    """

    def __init__(self, path: str, file_bytes: int):
        self.path, self.size, self.left = path, file_bytes, file_bytes

    def take(self, n: int, name: str, i: int) -> None:
        """Charge `n` entries about to be converted for `name` of sample `i`; refuse past the budget."""
        self.left -= n
        if self.left < 0:
            raise UserError(
                f"{self.path}: {name} of sample {i}: the samples so far need more entries than the "
                f"file's {self.size:,} bytes can hold (lists or tensors shared between samples); "
                "refusing to expand them"
            )
