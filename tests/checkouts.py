"""Where the tests find real slime and Megatron-LM, and what a missing checkout means.

    NANSCOPE_SLIME_SRC        a directory with one slime checkout per tag (v0.1.0/, v0.2.4/, v0.3.1/, main/)
    NANSCOPE_TEST_MEGATRON_LM_SRC  Megatron-LM's tree at the case's release (holding megatron/ with megatron.training)

Unset, each defaults to the copy CI has beside the repository (`../shared/slime-src`,
`../shared/megatron-lm/core_v0.15.0rc0`) when that directory exists. Paths are absolute: some tests change
the working directory.

No silent skip: where `../shared/slime-src` exists, a release test that would skip for want of a checkout
fails instead (`missing`), so CI never passes a release guarantee it did not test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SHARED_SLIME = SHARED / "slime-src"
SHARED_MEGATRON_LM = SHARED / "megatron-lm" / "core_v0.15.0rc0"
RELEASES = ("v0.1.0", "v0.2.4", "v0.3.1", "main")


def _resolved(variable: str, shared: Path) -> Path | None:
    value = os.environ.get(variable)
    if value:
        return Path(value).resolve()
    return shared if shared.is_dir() else None


SLIME_SRC = _resolved("NANSCOPE_SLIME_SRC", SHARED_SLIME)
MEGATRON_LM_SRC = _resolved("NANSCOPE_TEST_MEGATRON_LM_SRC", SHARED_MEGATRON_LM)
NO_SLIME = "NANSCOPE_SLIME_SRC is not set and ../shared/slime-src does not exist (tests/checkouts.py)"


def must_have() -> bool:
    """A missing checkout fails the run: CI's copy of slime is beside the repository."""
    return SHARED_SLIME.is_dir()


def missing(what: str) -> None:
    """A checkout the test needs is not there: skip, or fail where CI's copy exists (no silent skip)."""
    if must_have():
        pytest.fail(f"{what}, though {SHARED_SLIME} exists: a release test may not skip for want of a checkout")
    pytest.skip(what)


def slime_release(tag: str) -> Path:
    """The checkout of slime `tag` (a directory holding `slime/`), or `missing`."""
    if SLIME_SRC is None:
        missing(NO_SLIME)
    checkout = SLIME_SRC / tag
    if not (checkout / "slime").is_dir():
        missing(f"no slime checkout for {tag} at {checkout}")
    return checkout


WHERE = (
    "get slime from https://github.com/THUDM/slime (one checkout per tag under NANSCOPE_SLIME_SRC) and Megatron-LM "
    "from https://github.com/NVIDIA/Megatron-LM at core_v0.15.0rc0 (NANSCOPE_TEST_MEGATRON_LM_SRC): docs/testing.md"
)


def not_tested_line(skipped) -> str | None:
    """The summary's line for the skipped test reports whose reason is a missing checkout; None when there are
    none."""
    count = sum(1 for report in skipped if _for_a_checkout(report))
    if not count:
        return None
    return f"NOT TESTED: {count} test{'s' if count != 1 else ''} SKIPPED for want of a checkout; {WHERE}"


def _for_a_checkout(report) -> bool:
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return "checkout" in reason or "NANSCOPE_SLIME_SRC" in reason or "MEGATRON_LM_SRC" in reason
