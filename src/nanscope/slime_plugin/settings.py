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

An empty value counts as unset. A bad value is one ValueError line that names the variable; numbers are
ASCII digits only (`int()` would take '٣' or '３').
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from nanscope.loss.guard import NAN_POLICIES

ON_NONFINITE = ("raise", "skip")
_MAX_DIGITS = 18  # any count or step id a run can reach; longer is a typo, not a number


@dataclass(frozen=True)
class Settings:
    """The plugin's settings (the module docstring names the variable behind each field)."""

    report_dir: str = "nanscope_reports"
    on_nonfinite: str = "raise"
    max_skips: int | None = None
    trace_step: tuple[int, int] | None = None
    nan_policy: str = "drop"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        mode = _choice(env, "NANSCOPE_ON_NONFINITE", ON_NONFINITE)
        max_skips = env.get("NANSCOPE_MAX_SKIPS") or None
        if max_skips is not None and not (_digits(max_skips) and int(max_skips) >= 1):
            raise ValueError(f"NANSCOPE_MAX_SKIPS={_shown(max_skips)}: expected an integer >= 1")
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
        )


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """The variable's value, one of `choices` (the first when unset)."""
    value = env.get(name) or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={_shown(value)}: expected one of {', '.join(choices)}")
    return value


def _digits(text: str) -> bool:
    """ASCII digits only, and few enough of them to be a count."""
    return 0 < len(text) <= _MAX_DIGITS and all("0" <= c <= "9" for c in text)


def _shown(value: str, n: int = 40) -> str:
    """The value as the error line quotes it: whole when short, its start and length when not."""
    return repr(value) if len(value) <= n else f"{value[:n]!r}... ({len(value)} characters)"
