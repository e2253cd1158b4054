"""What tests/verl's plugin cases share: issue 43's install line and loss mode, the report directory, runs cached
per session (a run verl alone, the reference of several cases, is made once)."""

from __future__ import annotations

import math
from pathlib import Path

from tests.verl import harness
from tests.verl.harness import Spec

# issue 43: `actor_rollout_ref.model.external_lib=nanscope.verl_plugin` and `actor.policy_loss.loss_mode=nanscope`
# wrapping NANSCOPE_INNER_LOSS_MODE (default vanilla)
ENGINE = "nanscope.verl_plugin"


def spec(*, env: dict | None = None, install: str = "external_lib", **fields) -> Spec:
    return Spec(install=install, loss_mode="nanscope", env=dict(env or {}), **fields)


def with_reports(tmp_path: Path, env: dict | None = None) -> dict:
    return {"NANSCOPE_REPORT_DIR": str(tmp_path / "reports"), **(env or {})}


def finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def ours(rank: harness.Rank) -> bool:
    """The engine is nanscope's subclass (of verl's FSDPEngineWithLMHead)."""
    return rank.engine is not None and rank.engine.startswith(ENGINE + ".")


def report(tmp_path: Path, rank: int) -> Path:
    """The one report rank `rank` wrote under NANSCOPE_REPORT_DIR (its name is the plugin's: *_rank<R>.json)."""
    found = sorted((tmp_path / "reports").glob(f"*rank{rank}.json"))
    assert len(found) == 1, f"rank {rank}'s reports: {found}"
    return found[0]
