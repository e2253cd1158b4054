"""A dump being read: `Dump`, whose samples stream once as `SampleData` (compact arrays, what the checks read).

The readers that fill them are `nanscope.dumps.io` (the entry point), `nanscope.dumps.rollout_dump` and
`nanscope.dumps.train_dump`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.dumps import formats
from nanscope.dumps.formats import DumpFormat


@dataclass
class SampleData:
    """One sample as compact arrays; what the checks read.

    Per-token arrays hold one entry per position in `positions` (response positions, 0-based). For rollout
    dumps and cp=1 train dumps `positions` is None, meaning 0..response_length-1.

    Attributes:
        sample: 0-based index of the sample in the file.
        prompt_length: len(tokens) - response_length (the offset of response token 0 in the sequence).
        response_length: as stored.
        tokens_length: len(tokens).
        loss_mask: int8 [response_length] (slime's default of all ones when the dump has None; empty then
            if response_length > len(tokens), a length mismatch that stops the sample's checks).
        reward: the scalar reward (rollout dumps: raw, after --reward-key; train dumps: normalised `rewards`).
        rollout_log_probs, log_probs, ref_log_probs, advantages: float arrays or None when absent.
        positions: int64 response positions of the per-token arrays (CP-sliced train dumps), or None.
        lengths: field name -> length as stored, for the length checks.
        tokens: int64 [tokens_length], the token ids: read only for token maps (`io.load(tokens=True)`).
    """

    sample: int
    prompt_length: int
    response_length: int
    tokens_length: int
    loss_mask: np.ndarray
    reward: float | None = None
    rollout_log_probs: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    ref_log_probs: np.ndarray | None = None
    advantages: np.ndarray | None = None
    positions: np.ndarray | None = None
    lengths: dict[str, int] = field(default_factory=dict)
    tokens: np.ndarray | None = None


@dataclass
class Dump:
    """A dump being read. `samples()` streams `SampleData` once; for a rollout dump read by the restricted
    unpickler the file is still being parsed while samples come out.

    Attributes:
        path: the file.
        kind: "rollout" or "train".
        rollout_id: as stored (a rollout dump's is known once `samples()` is exhausted).
        rank: the global rank (train dumps) or None.
        num_samples: samples handed out so far; the file's number once `samples()` is exhausted.
        cp_size: context-parallel size the per-token arrays are sliced for (train dumps).
        format: the release format the file was read as.
    """

    path: str
    kind: str
    rollout_id: Any
    rank: int | None
    cp_size: int = 1
    num_samples: int = 0
    format: DumpFormat = formats.V0_1_0
    _rows: Iterator[SampleData] | None = None
    _progress: Callable[[], tuple[int, int]] | None = None  # while streaming: (pickle bytes read, all)
    _total: int = 0  # samples in the file, when known before they stream

    @classmethod
    def from_samples(
        cls, path: str, kind: str, samples: list[SampleData], rollout_id: Any = None, rank: int | None = None
    ) -> Dump:
        """A Dump over samples already converted (to time the checks apart from loading), read as v0.1.0's."""
        return cls(path, kind, rollout_id, rank, _rows=iter(samples))

    def samples(self) -> Iterator[SampleData]:
        """Yield each sample once."""
        assert self._rows is not None, "samples() consumed twice"
        rows, self._rows = self._rows, None
        for sample in rows:
            self.num_samples += 1
            yield sample

    def progress(self) -> tuple[int, int]:
        """(done, total) in the reader's own units: pickle bytes while streaming, else samples."""
        return self._progress() if self._progress else (self.num_samples, max(self._total, self.num_samples))
