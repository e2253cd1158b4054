"""Moved: the code is in `nanscope.trace.tracer.locator` (nanscope/trace/tracer/locator.py).

This path stays importable for code written before the move (the Tracer, the package's documented entry point for a
replay): it re-exports that module's public names. New code imports the new home.
"""

from nanscope.trace.tracer.locator import (
    Tracer,
    source_text,
    user_frame,
)

__all__ = [
    "Tracer",
    "source_text",
    "user_frame",
]
