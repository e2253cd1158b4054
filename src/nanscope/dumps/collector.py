"""What a scan accumulates while the checks run: exact counts, a capped list of findings, per-sample counts,
the mechanisms each check found (and whether any for certain), the log-ratio histograms and the error lines.
"""

from __future__ import annotations

import numpy as np

from nanscope.dumps.dump import SampleData
from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.result import HIST_LO, Finding, Histogram

# Findings listed in all (counts stay exact): a hostile file cannot make the list outgrow memory.
MAX_LISTED = 100_000


class Collector:
    """Accumulates exact counts, a capped list of findings, per-sample counts and histograms.

    Args:
        flags: the scan's flags (`max_listed` caps the findings listed per check and sample).
        looks_at: check kind -> what it looks at, in report order: the columns of the per-sample counts,
            and the labels of the histograms.
    """

    def __init__(self, flags: ScanFlags, looks_at: dict[str, str]):
        self.flags, self.looks_at = flags, looks_at
        self.kinds = tuple(looks_at)
        self.hazards: list[Finding] = []
        self.counts = dict.fromkeys(self.kinds, 0)
        self.listed = dict.fromkeys(self.kinds, 0)
        self.mechanisms: dict[str, dict[str, bool]] = {k: {} for k in self.kinds}  # kind -> mechanism -> any certain
        self.rows: dict[int, np.ndarray] = {}  # sample -> counts per kind, for samples with findings only
        self.column = {k: j for j, k in enumerate(self.kinds)}
        self.hist: dict[str, Histogram] = {}
        self.errors: list[str] = []

    def _note(self, kind: str, mechanism: str | None, certain: bool, n: int, sample: int) -> None:
        self.counts[kind] += n
        row = self.rows.get(sample)
        if row is None:
            row = self.rows[sample] = np.zeros(len(self.kinds), np.int64)
        row[self.column[kind]] += n
        if mechanism is not None:
            found = self.mechanisms[kind]
            found[mechanism] = found.get(mechanism, False) or certain

    def per_sample(self, num_samples: int) -> np.ndarray:
        """int64 [num_samples, len(kinds)]: findings per sample and check."""
        out = np.zeros((num_samples, len(self.kinds)), np.int64)
        for i, row in self.rows.items():
            out[i] = row
        return out

    def _room(self) -> bool:
        return len(self.hazards) < MAX_LISTED

    def sample_level(
        self, kind: str, sample: int, mechanism: str | None, value, detail: str = "", certain: bool = True
    ) -> None:
        self._note(kind, mechanism, certain, 1, sample)
        if self._room():
            self.listed[kind] += 1
            self.hazards.append(
                Finding(
                    kind=kind,
                    mechanism=mechanism,
                    sample=sample,
                    token=None,
                    abs_token=None,
                    masked=None,
                    value=value,
                    certain=certain,
                    detail=detail,
                )
            )

    def tokens(
        self,
        kind: str,
        sample: SampleData,
        hit: np.ndarray,
        values: np.ndarray,
        masked: np.ndarray,
        *,
        mechanism: str | None,
        certain: bool = True,
    ) -> None:
        """Record the per-token entries where `hit` is True (values/masked are indexed like hit, the entries
        of `sample.positions`, or of the response when it is None)."""
        local = np.flatnonzero(hit)
        if local.size == 0:
            return
        self._note(kind, mechanism, certain, int(local.size), sample.sample)
        local = local[: min(self.flags.max_listed, MAX_LISTED - len(self.hazards))]
        self.listed[kind] += int(local.size)
        positions = local if sample.positions is None else sample.positions[local]
        for j, token in zip(local.tolist(), positions.tolist()):
            self.hazards.append(
                Finding(
                    kind=kind,
                    mechanism=mechanism,
                    sample=sample.sample,
                    token=token,
                    abs_token=sample.prompt_length + token,
                    masked=bool(masked[j]),
                    value=float(values[j]),
                    certain=certain,
                )
            )

    def histogram(self, kind: str, x: np.ndarray, masked: np.ndarray) -> None:
        """Add the log-ratios x of one sample to check `kind`'s histogram (labelled with what it looks at)."""
        hist = self.hist.get(kind) or self.hist.setdefault(kind, Histogram.empty(self.looks_at[kind]))
        nan = np.isnan(x)
        if nan.any():
            hist.nan += int(nan.sum())
            x, masked = x[~nan], masked[~nan]
        # Bin b holds [LO+b-1, LO+b); 0 is underflow (and -inf), the last is overflow (and +inf). Shifted
        # to be >= 0 before the cast, truncation is floor. Even slots count unmasked tokens, odd masked.
        shifted = np.subtract(x, HIST_LO - 1, dtype=np.float32)
        np.clip(shifted, 0, hist.all.size - 1, out=shifted)
        slot = shifted.astype(np.int32)
        slot *= 2
        slot += masked
        both = np.bincount(slot, minlength=2 * hist.all.size)
        hist.all += both[0::2] + both[1::2]
        hist.masked += both[1::2]
