"""tests/verl: verl 0.9.0's own actor update, end to end (the `verl` tier: `pytest -m verl` in .ci/verl-env's env).

Every test here is marked `verl` (plain `pytest` deselects it: pyproject's addopts). It needs verl 0.9.0 importable
(the environment .ci/verl-env builds from .ci/verl-requirements.txt and ../shared/verl-src/v0.9.0). No silent skip:
where ../shared/verl-src/v0.9.0 exists (CI), a verl that cannot be imported fails the tier instead of skipping it.

The CPU stand-ins are tests/verl/standins.py's (each names what it replaces), applied in the rank processes only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHARED_VERL = HERE.parents[2] / "shared" / "verl-src" / "v0.9.0"
VERSION = "0.9.0"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.verl)


def _verl_version() -> str | None:
    try:
        import verl
    except ImportError:
        return None
    return verl.__version__


@pytest.fixture(scope="session")
def verl_env() -> str:
    """verl's version here, or skip (fail where CI's tree exists: the tier may not pass untested)."""
    version = _verl_version()
    if version != VERSION:
        why = f"verl {VERSION} is not importable here (found {version}): run .ci/verl-env and its python"
        if SHARED_VERL.is_dir():
            pytest.fail(f"{why}, though {SHARED_VERL} exists")
        pytest.skip(why)
    return version


@pytest.fixture(scope="session")
def model(verl_env, tmp_path_factory) -> str:
    """The tiny Qwen3 every run here trains (tests/verl/harness.py: tiny_qwen3)."""
    from tests.verl import harness

    return harness.tiny_qwen3(tmp_path_factory.mktemp("verl") / "qwen3")


@pytest.fixture(scope="session")
def critic_model(verl_env, tmp_path_factory) -> str:
    """The tiny Qwen3 with a value head every critic run here trains (tests/verl/harness.py: tiny_qwen3_critic)."""
    from tests.verl import harness

    return harness.tiny_qwen3_critic(tmp_path_factory.mktemp("verl") / "qwen3-critic")
