"""The mechanisms a scan names and its verdict: would slime's loss be NaN on this dump (yes, possibly, no)?

The mechanisms are the hazard catalogue's names (`nanscope.causes.catalogue`) plus the scan's own
`NAN_LOGPROB`. A finding whose check reads only a bound (rollout dumps' log-ratios) names its mechanism
"possibly"; one that reads exact values, for certain. `SIGNALS` are found and reported, but leave the loss
finite: they are kept out of the NaN verdict and named after it.
"""

from __future__ import annotations

from nanscope.causes import catalogue

NAN_LOGPROB = "nan-logprob"
"""A scan-only mechanism, not in the hazard catalogue: a non-finite old or reference log-prob in a train
dump makes the PPO ratio or the KL term NaN, so the loss is NaN."""

# Mechanisms in verdict order.
MECHANISMS = (
    catalogue.KL_EXP_OVERFLOW.name,
    catalogue.RATIO_EXP_OVERFLOW.name,
    catalogue.NAN_ROLLOUT_LOGPROB.name,
    catalogue.NAN_REWARD.name,
    NAN_LOGPROB,
)

# Found and reported, but the loss stays finite: not part of the NaN verdict.
SIGNALS = (catalogue.ROLLOUT_LOGPROB_SHIFT.name,)


def verdict(found: dict[str, dict[str, bool]], release: str) -> tuple[str, list[str], str]:
    """(would_nan, mechanisms, the verdict's text) from what the checks found.

    Args:
        found: check kind -> mechanism -> whether any finding of it was certain (`Collector.mechanisms`).
        release: the release whose loss the verdict names (the dump's format).
    """
    certain, possible = set(), set()
    for mechanisms in found.values():
        for mechanism, is_certain in mechanisms.items():
            (certain if is_certain else possible).add(mechanism)
    possible -= certain
    yes = [m for m in MECHANISMS if m in certain]
    maybe = [m for m in MECHANISMS if m in possible]
    would, mechanisms, text = _nan_verdict(yes, maybe, f"slime {release}")
    signals = [m for m in SIGNALS if m in certain]
    if signals:
        text += (
            f"; rollout log-probs disagree with the log-prob pass ({', '.join(signals)}): the loss stays "
            "finite, the TIS weights and the tis metric do not"
        )
    return would, mechanisms, text


def _nan_verdict(yes: list[str], maybe: list[str], slime: str) -> tuple[str, list[str], str]:
    if yes:
        text = f"{slime} would produce NaN: yes, via {', '.join(yes)}"
        if maybe:
            text += f"; possibly also via {', '.join(maybe)} (bounds only)"
        return "yes", yes + maybe, text
    if maybe:
        return (
            "possibly",
            maybe,
            f"{slime} would produce NaN: possibly, via {', '.join(maybe)} (bounds only: dump train data to confirm)",
        )
    return "no", [], f"{slime} would produce NaN: no"
