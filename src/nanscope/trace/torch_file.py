"""Moved: the code is in `nanscope.trace.loading.torch_file` (nanscope/trace/loading/torch_file.py).

This path stays importable for code written before the move (the bounds of every torch.save reader, which the README
cites): it re-exports that module's public names. New code imports the new home.
"""

from nanscope.trace.loading.torch_file import (
    BadArchive,
    Compressed,
    check_records,
    load,
    overrun,
    plain_problem,
    refusal,
    where,
)

__all__ = [
    "BadArchive",
    "Compressed",
    "check_records",
    "load",
    "overrun",
    "plain_problem",
    "refusal",
    "where",
]
