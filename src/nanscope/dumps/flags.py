"""The slime flags a scan checks a dump against (no torch import: the CLI builds its defaults and --help from it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScanFlags:
    """The slime v0.1.0 flags that decide which inputs are hazards, and how much a scan lists;
    `nanscope.case.scan_config()` gives the case's."""

    n_samples_per_prompt: int
    reward_key: str | None
    rollout_max_response_len: int | None
    advantage_estimator: str
    rewards_normalization: bool
    grpo_std_normalization: bool
    use_kl_loss: bool
    kl_loss_type: str
    use_tis: bool
    max_listed: int = 100  # findings listed per (kind, sample); counts are always exact
    histograms: bool = False  # per-token log-ratio histograms (for the HTML plots; ~1/3 of the check time)
