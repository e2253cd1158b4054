"""The slime flags a scan depends on (no torch import: the CLI builds its defaults and --help from it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScanConfig:
    """The slime v0.1.0 flags that decide which inputs are hazards; `for_case()` gives the case's values."""

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

    @classmethod
    def for_case(cls, **overrides) -> ScanConfig:
        """The slime-795 case's flags (its launch.sh over slime's defaults), `overrides` applied."""
        from nanscope import case
        from nanscope.slime_args import case_args

        a = case_args()
        values = dict(
            n_samples_per_prompt=a.n_samples_per_prompt, reward_key=None,
            rollout_max_response_len=case.config()["rollout_max_response_len"],
            advantage_estimator=a.advantage_estimator, rewards_normalization=a.rewards_normalization,
            grpo_std_normalization=a.grpo_std_normalization, use_kl_loss=a.use_kl_loss,
            kl_loss_type=a.kl_loss_type, use_tis=a.use_tis,
        )  # fmt: skip
        return cls(**{**values, **overrides})
