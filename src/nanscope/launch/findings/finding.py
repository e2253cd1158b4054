"""A finding: one rule that fired, and what the rules of every family share.

A rule reads the resolved configuration and returns a Finding (or nothing): the flags that are the
evidence, the mechanism in two sentences, and the fix (a flag change where one exists, else the
nanscope slime plugin, `PLUGIN`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.facts import releases
from nanscope.launch.config import Config

PLUGIN = "--loss-type custom_loss --custom-loss-function-path nanscope.slime_plugin.policy_loss"
SEVERITIES = ("critical", "high", "medium", "low", "info")


@dataclass
class Finding:
    """One rule that fired.

    Attributes:
        id: stable kebab-case id.
        severity: one of SEVERITIES.
        title: one line.
        flags: the flags that are the evidence, as written (`--kl-loss-coef 0`).
        mechanism: two sentences: what happens numerically.
        fix: a flag change and/or the nanscope slime plugin.
        hazards: nanscope hazard names this corresponds to.
    """

    id: str
    severity: str
    title: str
    flags: list[str]
    mechanism: str
    fix: str
    hazards: list[str] = field(default_factory=list)


def slime_policy_loss(cfg: Config) -> bool:
    """The loss-side rules are about the release's own policy_loss_function."""
    return cfg["loss_type"] == "policy_loss"


def release_of(cfg: Config) -> releases.SlimeRelease:
    """The record of the release whose rules apply."""
    return releases.BY_KEY[cfg.release]
