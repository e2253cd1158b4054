"""Where other RL frameworks' loss code has the defects of nanscope's loss-numerics hazards, release by release, read
in their own code (verl-project/verl, OpenRLHF/OpenRLHF at their tags).

A `Defect` is one exp of a log-ratio: before its clamp (the hazard's mechanism: an extreme but finite log-ratio
overflows exp, and the clamp's zero gradient times inf is NaN in backward), or after one (safe). Each span of
releases cites the lines at a release inside it.

    defects("verl", "kl-exp-overflow")   # [Defect(... "v0.4.0", ...), Defect(... "v0.4.1", ...)]
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.facts.frameworks import OPENRLHF, VERL

_VERL_CORE = "verl/trainer/ppo/core_algos.py"
_OPENRLHF_KL = "openrlhf/models/utils.py"
_OPENRLHF_LOSS = "openrlhf/models/loss.py"


@dataclass(frozen=True)
class Defect:
    """One exp of a log-ratio in a framework's loss, over a span of its releases.

    Attributes:
        framework: facts.frameworks name.
        cause: the catalogue hazard (kl-exp-overflow, ratio-exp-overflow, logprob-drift).
        first, last: the releases of the span (None: the oldest read / the newest read), as the tags spell them.
        present: the exp comes before its clamp (the defect); False: the log-ratio is clamped first.
        where: file:line at a release in the span.
        when: the flags under which this code runs, in the framework's words.
    """

    framework: str
    cause: str
    first: str | None
    last: str | None
    present: bool
    where: str
    when: str


def _d(framework: str, cause: str, span: tuple[str | None, str | None, bool], where: str, when: str) -> Defect:
    """span: (the first release, the last, whether the exp comes before its clamp there)."""
    return Defect(framework, cause, first=span[0], last=span[1], present=span[2], where=where, when=when)


_VERL_KL = "actor_rollout_ref.actor.use_kl_loss=True with kl_loss_type low_var_kl or k3 (the default type)"
_VERL_VANILLA = "policy_loss.loss_mode=vanilla (the default)"
_OPENRLHF_K3 = "--use_kl_loss with --kl_estimator k3 (v0.11: --algo.kl.estimator k3)"
_OPENRLHF_PPO = "--policy_loss_type ppo (the default)"
DEFECTS: tuple[Defect, ...] = tuple(
    defect
    for cause in ("kl-exp-overflow", "logprob-drift")  # the drift reaches the same exp, step by step
    for defect in (
        _d(VERL, cause, (None, "v0.4.0", True), f"{_VERL_CORE}:594-598 (v0.4.0): kl = ref - logp; exp(kl); the result "
           "clamped to [-10, 10] after", _VERL_KL),
        _d(VERL, cause, ("v0.4.1", None, False), f"{_VERL_CORE}:855-858 (v0.4.1), :2239-2242 (v0.9.0): kl clamped to "
           "[-20, 20] before exp", _VERL_KL),
        _d(OPENRLHF, cause, (None, None, True), f"{_OPENRLHF_KL}:35-38 (v0.7.0: never clamped), :35-40 (v0.9.0), "
           ":88-95 (v0.11.0): k3 = exp(-log_ratio) - 1 + log_ratio first, the clamp to [-10, 10] after", _OPENRLHF_K3),
    )
) + (
    _d(VERL, "ratio-exp-overflow", (None, "v0.4.0", True), f"{_VERL_CORE}:496-497 (v0.4.0): ratio = exp(log_prob - "
       "old_log_prob), no clamp", _VERL_VANILLA),
    _d(VERL, "ratio-exp-overflow", ("v0.4.1", None, False), f"{_VERL_CORE}:601-604 (v0.4.1), :1336-1339 (v0.9.0): the "
       "log-ratio clamped to [-20, 20] before exp", _VERL_VANILLA),
    _d(VERL, "ratio-exp-overflow", ("v0.4.1", None, True), f"{_VERL_CORE}:675-676, :750-752 (v0.4.1), :1796-1797, "
       ":1888-1890 (v0.9.0): clip_cov and kl_cov take exp of the unclamped log-ratio",
       "policy_loss.loss_mode=clip_cov or kl_cov"),
    _d(OPENRLHF, "ratio-exp-overflow", (None, "v0.10.2", True), f"{_OPENRLHF_LOSS}:123-124 (v0.10.2): ratio = "
       "log_ratio.exp(), no clamp", _OPENRLHF_PPO),
    _d(OPENRLHF, "ratio-exp-overflow", ("v0.10.3", None, False), f"{_OPENRLHF_LOSS}:158-160 (v0.10.3), :167-169 "
       "(v0.11.0): the log-ratio clamped to [-20, 20] before exp", _OPENRLHF_PPO),
)  # fmt: skip
RELEASES_READ = {VERL: "v0.2 .. v0.9.0 (2026-08-14)", OPENRLHF: "v0.5.0 .. v0.11.0 (2026-08-13)"}


def defects(framework: str, cause: str) -> list[Defect]:
    return [defect for defect in DEFECTS if defect.framework == framework and defect.cause == cause]


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.lstrip("v").split(".")[:3] if part.isdigit())


def in_span(defect: Defect, release: str) -> bool:
    """`release` is inside the defect's span of releases."""
    low = defect.first is None or _key(release) >= _key(defect.first)
    return low and (defect.last is None or _key(release) <= _key(defect.last))
