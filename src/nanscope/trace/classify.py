"""Moved: the code is in `nanscope.trace.sentinels.classify` (nanscope/trace/sentinels/classify.py).

This path stays importable for code written before the move (the classes of cause of a sentinel reading, which
docs/cause.md cites): it re-exports that module's public names. New code imports the new home.
"""

from nanscope.trace.sentinels.classify import (
    Classification,
    Observation,
    classify,
    layer_of,
)

__all__ = [
    "Classification",
    "Observation",
    "classify",
    "layer_of",
]
