"""Moved: the code is in `nanscope.trace.tracer.replay` (nanscope/trace/tracer/replay.py).

This path stays importable for code written before the move (the micro-batch file of `nanscope trace FILE.pt`, whose
format the README cites): it re-exports that module's public names. New code imports the new home.
"""

from nanscope.trace.tracer.replay import (
    COUNTS,
    FORMAT,
    SENTINEL_FORMAT,
    arg_problem,
    count_nonfinite,
    document,
    load_microbatch,
    mask_problem,
    replay,
    sample_count,
    save_microbatch,
    scan_batch,
    select_samples,
    token_map,
    token_problem,
    value_text,
)

__all__ = [
    "COUNTS",
    "FORMAT",
    "SENTINEL_FORMAT",
    "arg_problem",
    "count_nonfinite",
    "document",
    "load_microbatch",
    "mask_problem",
    "replay",
    "sample_count",
    "save_microbatch",
    "scan_batch",
    "select_samples",
    "token_map",
    "token_problem",
    "value_text",
]
