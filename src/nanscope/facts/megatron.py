"""megatron-core's own words: the version the evidence cites and the messages its NaN checks raise.

The texts are megatron-core 0.15.0rc0's (`MCORE`), the release whose line numbers match the case's
traceback. A check's message reaches the user inside the RerunStateMachine's error:

    RuntimeError: Rank R, node N, device D, iteration I: Unexpected result nan (message='found NaN in local
    grad norm for bucket #0 in backward pass before data-parallel communication collective')
"""

from __future__ import annotations

import re

MCORE = "megatron-core 0.15.0rc0"

# distributed/param_and_grad_buffer.py:187-188 and :195-196: the DDP bucket check, NaN then Inf, per bucket.
BUCKET_NONFINITE = "found {kind} in local grad norm for bucket #{bucket} in backward pass before data-parallel communication collective"
# rerun_state_machine.py:503: how validate_result words a rejected result.
UNEXPECTED_RESULT = "Unexpected result {result} (message='{message}')"


def bucket_check_pattern() -> re.Pattern:
    """The DDP bucket check's error (NaN or Inf, any bucket) at the end of a message."""
    message = re.escape(BUCKET_NONFINITE).replace(r"\{kind\}", "(?:NaN|Inf)").replace(r"\{bucket\}", r"\d+")
    text = re.escape(UNEXPECTED_RESULT).replace(r"\{result\}", "(?:nan|inf)").replace(r"\{message\}", message)
    return re.compile(text + "$")


def core_frame(path: str, line: int, function: str) -> tuple[str, int, str] | None:
    """(file basename, line, function) of a traceback frame inside megatron-core's package, else None.

    A frame's path may use either separator (a traceback pasted from Windows, or one of this process).
    """
    norm = path.replace("\\", "/")
    return (norm.rsplit("/", 1)[-1], line, function) if "/megatron/core/" in norm else None
