"""A traceback's own error line, whatever it names, where no reader of NaN evidence took it:

    Traceback (most recent call last):
      File ".../trl/models/modeling_value_head.py", line 178, in forward
        if lm_logits.dtype != torch.float32:
    AttributeError: 'NoneType' object has no attribute 'dtype'        <- a different failure: no NaN or Inf named

A traceback that ends in such a line is not cut before its error: it ended in an error that is not a NaN failure.
A paste that lost its newlines holds it on the frame's line (`File "...", line 178, in forward if ...: ^^^^
AttributeError: ...`). Bounded windows and repeats only: linear in the line.

    error = error_line(context)    # "AttributeError: 'NoneType' object has no attribute 'dtype'", or None
"""

from __future__ import annotations

import re

WINDOW = 2048  # characters of a line read
MAX_SHOWN = 300  # characters of the message kept
# CPython's last traceback line: the exception's (qualified) name, then `: message` (traceback.format_exception_only)
_EXCEPTION = re.compile(r"(?P<exc>(?:[A-Za-z_]\w{0,60}\.){0,8}[A-Z]\w{0,60}(?:Error|Exception|Exit|Interrupt|Failure))"
                        r"(?::\s(?P<msg>[^\n]{0,2000}))?\s*$")  # fmt: skip
# the same, on a frame's line whose newlines a paste lost: after the frame's code and its `^^^^` marks
_SQUASHED = re.compile(r"\s(?P<exc>[A-Z]\w{0,60}(?:Error|Exception)):\s(?P<msg>[^\n]{0,2000})")


def error_line(context: list[str]) -> str | None:
    """The error line after the traceback's last frame in `context` (its lines, log prefixes gone); None: none."""
    last = max((i for i, line in enumerate(context) if 'File "' in line), default=None)
    if last is None:
        return None
    squashed = _SQUASHED.search(context[last], context[last].find('File "'), WINDOW)
    if squashed is not None:
        return _shown(squashed)
    for line in context[last + 1 : last + 8]:  # the frame's code line and its marks, then the error
        if line[:1].isspace() or not line.strip():
            continue
        match = _EXCEPTION.match(line[:WINDOW])
        return _shown(match) if match is not None else None
    return None


def _shown(match: re.Match) -> str:
    message = (match["msg"] or "").strip()
    cut = "..." if len(message) > MAX_SHOWN else ""
    return f"{match['exc']}: {message[:MAX_SHOWN]}{cut}" if message else match["exc"]
