"""Moved: the code is in `nanscope.trace.tracer.step` (nanscope/trace/tracer/step.py).

This path stays importable for code written before the move (NANSCOPE_TRACE_STEP's trace of one step on every rank):
it re-exports that module's public names. New code imports the new home.
"""

from nanscope.trace.tracer.step import (
    RolloutIndex,
    StepTrace,
    first_across_ranks,
    microbatch_map,
)

__all__ = [
    "RolloutIndex",
    "StepTrace",
    "first_across_ranks",
    "microbatch_map",
]
