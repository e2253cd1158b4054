"""Moved: the code is in `nanscope.trace.sentinels.sentinel` (nanscope/trace/sentinels/sentinel.py).

This path stays importable for code written before the move (the Sentinel, the package's documented entry point for
training steps): it re-exports that module's public names. New code imports the new home.
"""

from nanscope.trace.sentinels.sentinel import (
    Sentinel,
)

__all__ = [
    "Sentinel",
]
