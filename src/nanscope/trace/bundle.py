"""Moved: the code is in `nanscope.trace.bundles.bundle` (nanscope/trace/bundles/bundle.py).

This path stays importable for code written before the move (the repro bundle's format, which the README and the
slime plugin's docs cite): it re-exports that module's public names. New code imports the new home.
"""

from nanscope.trace.bundles.bundle import (
    FORMAT,
    SUFFIX,
    WHY,
    plain,
    plain_args,
    plain_batch,
    split,
)

__all__ = [
    "FORMAT",
    "SUFFIX",
    "WHY",
    "plain",
    "plain_args",
    "plain_batch",
    "split",
]
