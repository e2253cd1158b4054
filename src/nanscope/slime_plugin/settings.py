"""The plugin's settings: its environment variables, read once per installation into one object.

    NANSCOPE_REPORT_DIR    where reports go (default ./nanscope_reports)
    NANSCOPE_ON_NONFINITE  raise (default): Megatron's check ends the step, as without nanscope
                           | skip: zero the step's gradients on every rank, skip the optimizer and
                           learning-rate steps; optimizer.step returns grad norm NaN, as slime's own
                           check_for_nan_in_loss_and_grad=False path treats an invalid step
    NANSCOPE_MAX_SKIPS     K >= 1: with skip, end the run with an error when K steps in a row were skipped
                           (ignored with raise)
    NANSCOPE_TRACE_STEP    R:S: run rollout R's step S under the op tracer on every rank
    NANSCOPE_NAN_POLICY    drop (default) | strict: what the loss does with a non-finite log-prob or advantage
    NANSCOPE_RERUN         on (default) | off: run a non-finite step again once and say whether it reproduces
    NANSCOPE_SKIP_ON       any (default) | transient: with skip, skip every non-finite step, or only those whose
                           rerun did not reproduce and named no cause a rerun cannot rule out (another raises with
                           the verdict and the bundle); needs NANSCOPE_RERUN=on
    NANSCOPE_MAX_BUNDLES   N >= 0: repro bundles this rank writes in one run (default 8); later reports name none
    NANSCOPE_WARN_GAP      X: warn when the step's largest train-rollout log-prob gap exceeds X (default 5)
    NANSCOPE_WARN_LOG_RATIO  LOW,HIGH: warn when a log-ratio that reaches an exp exceeds LOW (default 20, where
                           the guard's clamp starts to act) or HIGH (default 60, within 30 of fp32's overflow);
                           0 < LOW < HIGH
    NANSCOPE_INNER_LOSS_MODE  NAME: verl only (nanscope.verl_plugin, `from_env(verl=True)`): the policy loss mode
                           verl's `nanscope` mode wraps (default vanilla); checked against verl's registry at install;
                           slime's plugin neither reads it nor counts it among its variables

An empty value counts as unset. A bad value, or settings that contradict each other, is one ValueError line
that names the variable; numbers are ASCII digits only (`int()` would take '٣' or '３'). Any other NANSCOPE_*
variable is kept in `unknown` (the hook warns about it at install, naming the closest real one), except the
test suite's own (NANSCOPE_SLIME_SRC, NANSCOPE_TEST_*).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from nanscope.facts.paths import REPORT_DIR
from nanscope.inputs import printable
from nanscope.loss.guard import NAN_POLICIES

ON_NONFINITE = ("raise", "skip")
RERUN = ("on", "off")
SKIP_ON = ("any", "transient")
_MAX_DIGITS = 18  # any count or step id a run can reach; longer is a typo, not a number
VARIABLES = (
    "NANSCOPE_REPORT_DIR", "NANSCOPE_ON_NONFINITE", "NANSCOPE_MAX_SKIPS", "NANSCOPE_TRACE_STEP", "NANSCOPE_NAN_POLICY",
    "NANSCOPE_RERUN", "NANSCOPE_SKIP_ON", "NANSCOPE_MAX_BUNDLES", "NANSCOPE_WARN_GAP", "NANSCOPE_WARN_LOG_RATIO",
)  # fmt: skip
VERL_VARIABLES = ("NANSCOPE_INNER_LOSS_MODE",)  # read only for nanscope.verl_plugin (`from_env(verl=True)`)
_NOT_THE_PLUGINS = ("NANSCOPE_SLIME_SRC",)  # the test suite's (tests/slime_releases), as is NANSCOPE_TEST_*


@dataclass(frozen=True)
class Settings:
    """The plugin's settings (the module docstring names the variable behind each field)."""

    report_dir: str = REPORT_DIR
    on_nonfinite: str = "raise"
    max_skips: int | None = None
    trace_step: tuple[int, int] | None = None
    nan_policy: str = "drop"
    rerun: str = "on"
    skip_on: str = "any"
    warn_gap: float = 5.0
    warn_log_ratio: tuple[float, float] = (20.0, 60.0)
    max_bundles: int = 8
    inner_loss_mode: str = "vanilla"
    unknown: tuple[str, ...] = field(default=(), compare=False)  # other NANSCOPE_* names in the environment
    variables: tuple[str, ...] = field(default=VARIABLES, compare=False, repr=False)  # the plugin's, for the warning

    def __post_init__(self):
        if self.skip_on == "transient" and self.rerun == "off":
            raise ValueError(
                "NANSCOPE_SKIP_ON=transient needs the rerun's verdict, and NANSCOPE_RERUN=off turns the rerun off: "
                "set NANSCOPE_RERUN=on, or NANSCOPE_SKIP_ON=any to skip every non-finite step"
            )

    def unknown_lines(self) -> list[str]:
        """One line per unknown NANSCOPE_* variable, naming the closest real one."""
        return [
            f"{printable(name)} is not one of the plugin's variables, so it does nothing; the closest is "
            f"{difflib.get_close_matches(name, self.variables, n=1, cutoff=0.0)[0]} (all: {', '.join(self.variables)})"
            for name in self.unknown
        ]

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, *, verl: bool = False) -> Settings:
        """The settings `env` holds; `verl`: also VERL_VARIABLES (nanscope.verl_plugin), which slime leaves unread."""
        variables = VARIABLES + (VERL_VARIABLES if verl else ())
        mode = _choice(env, "NANSCOPE_ON_NONFINITE", ON_NONFINITE)
        max_skips = env.get("NANSCOPE_MAX_SKIPS") or None
        if max_skips is not None and not (_digits(max_skips) and int(max_skips) >= 1):
            raise ValueError(f"NANSCOPE_MAX_SKIPS={_shown(max_skips)}: expected an integer >= 1")
        bundles = env.get("NANSCOPE_MAX_BUNDLES") or None
        if bundles is not None and not _digits(bundles):
            raise ValueError(f"NANSCOPE_MAX_BUNDLES={_shown(bundles)}: expected an integer >= 0")
        step = env.get("NANSCOPE_TRACE_STEP") or None
        parts = (step or "").split(":")
        if step is not None and not (len(parts) == 2 and all(_digits(p) for p in parts)):
            raise ValueError(f"NANSCOPE_TRACE_STEP={_shown(step)}: expected ROLLOUT:STEP, e.g. 12:0")
        return cls(
            report_dir=env.get("NANSCOPE_REPORT_DIR") or cls.report_dir,
            on_nonfinite=mode,
            max_skips=int(max_skips) if max_skips else None,
            trace_step=(int(parts[0]), int(parts[1])) if step is not None else None,
            nan_policy=_choice(env, "NANSCOPE_NAN_POLICY", NAN_POLICIES),
            rerun=_choice(env, "NANSCOPE_RERUN", RERUN),
            skip_on=_choice(env, "NANSCOPE_SKIP_ON", SKIP_ON),
            warn_gap=_numbers(env, "NANSCOPE_WARN_GAP", (cls.warn_gap,))[0],
            warn_log_ratio=_thresholds(env),
            max_bundles=int(bundles) if bundles is not None else cls.max_bundles,
            inner_loss_mode=_name(env, "NANSCOPE_INNER_LOSS_MODE", cls.inner_loss_mode)
            if verl
            else cls.inner_loss_mode,
            unknown=tuple(sorted(k for k in env if _unknown(k, variables))),
            variables=variables,
        )


def _unknown(name: str, variables: tuple[str, ...]) -> bool:
    return (
        name.startswith("NANSCOPE_")
        and name not in variables + _NOT_THE_PLUGINS
        and not name.startswith("NANSCOPE_TEST_")
    )


def _thresholds(env: Mapping[str, str]) -> tuple[float, float]:
    """NANSCOPE_WARN_LOG_RATIO: two numbers, 0 < LOW < HIGH (equal ones would make one warning the other's)."""
    low, high = _numbers(env, "NANSCOPE_WARN_LOG_RATIO", Settings.warn_log_ratio)
    if not 0 < low < high:
        value = env["NANSCOPE_WARN_LOG_RATIO"]
        raise ValueError(f"NANSCOPE_WARN_LOG_RATIO={_shown(value)}: expected LOW,HIGH with 0 < LOW < HIGH, like 20,60")
    return low, high


def _name(env: Mapping[str, str], name: str, default: str) -> str:
    """A registry name (letters, digits, '_', '-', '.'; at most 64): the variable's value, `default` when unset."""
    value = env.get(name) or default
    if not (len(value) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-.") for c in value)):
        raise ValueError(f"{name}={_shown(value)}: expected a loss mode's name, like vanilla or clip_cov")
    return value


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """The variable's value, one of `choices` (the first when unset)."""
    value = env.get(name) or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={_shown(value)}: expected one of {', '.join(choices)}")
    return value


def _numbers(env: Mapping[str, str], name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """As many non-negative decimal numbers (ASCII: 12 or 1.5) as `default` has, comma-separated, ascending."""
    value = env.get(name) or None
    if value is None:
        return tuple(default)
    parts = value.split(",")
    if len(parts) != len(default) or not all(_decimal(p) for p in parts) or parts != sorted(parts, key=float):
        form = ",".join(f"{d:g}" for d in default)
        raise ValueError(f"{name}={_shown(value)}: expected {len(default)} ascending number(s) like {form}")
    return tuple(float(p) for p in parts)


def _decimal(text: str) -> bool:
    whole, _, fraction = text.partition(".")
    return _digits(whole) and (not fraction or _digits(fraction)) and not text.endswith(".")


def _digits(text: str) -> bool:
    """ASCII digits only, and few enough of them to be a count."""
    return 0 < len(text) <= _MAX_DIGITS and all("0" <= c <= "9" for c in text)


def _shown(value: str, n: int = 40) -> str:
    """The value as the error line quotes it: whole when short, its start and length when not."""
    return repr(value) if len(value) <= n else f"{value[:n]!r}... ({len(value)} characters)"
