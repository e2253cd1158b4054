"""What a scan finds: each `Finding`, each check's `CheckSummary`, the log-ratio `Histogram`s, and the
`ScanResult` a renderer reads (`nanscope.report.scan`).

Every finding carries `sample` (0-based in the file), `token` (0-based in the response), `abs_token` (in
the whole sequence: prompt_length + token), `masked` (loss_mask 0) and `value`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.formats import DumpFormat

# Histogram of per-token log-ratios: unit bins on [LO, HI), plus an underflow and an overflow bin.
HIST_LO, HIST_HI = -40, 120


@dataclass
class Finding:
    """One hazard found in the dump. token/abs_token/masked are None for sample-level findings."""

    kind: str
    mechanism: str | None
    sample: int
    token: int | None
    abs_token: int | None
    masked: bool | None
    value: float | int | None
    certain: bool = True
    detail: str = ""


@dataclass
class CheckSummary:
    """One check's outcome: `count` findings (exact), `listed` of them in ScanResult.hazards."""

    kind: str
    status: str  # "ran" or "skipped"
    count: int = 0
    listed: int = 0
    mechanisms: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Histogram:
    """Counts of one per-token log-ratio: [under, LO..LO+1, ..., HI-1..HI, over]; nan counted apart."""

    label: str
    all: np.ndarray
    masked: np.ndarray
    nan: int = 0

    @staticmethod
    def empty(label: str) -> Histogram:
        n = HIST_HI - HIST_LO + 2
        return Histogram(label, np.zeros(n, np.int64), np.zeros(n, np.int64))


@dataclass
class ScanResult:
    """Everything a renderer needs. per_sample[i, k] counts findings of check KINDS[k] in sample i
    (`nanscope.dumps.checks.KINDS`, report order)."""

    path: str
    dump_kind: str
    rollout_id: object
    rank: int | None
    num_samples: int
    response_tokens: int
    flags: ScanFlags
    hazards: list[Finding]
    checks: list[CheckSummary]
    per_sample: np.ndarray
    histograms: dict[str, Histogram]
    errors: list[str]
    would_nan: str  # "yes", "possibly" or "no"
    mechanisms: list[str]  # certain ones first, then possible ones
    verdict: str
    format: DumpFormat


def hazard_count(result: ScanResult) -> int:
    """Total findings (exact, including those not listed)."""
    return sum(check.count for check in result.checks)
