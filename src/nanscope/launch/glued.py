"""Lines two streams wrote into one (stdout and stderr interleaved in a paste), read for the evidence glued on:

    main(args)RuntimeError:  [!] NaN loss with decoder_loss.       an error line glued onto a frame's code line
    {| Epoch: 13/1250 (3/8) | Loss: 2.610 | 0.68 steps/s | Step: 0k | }grad_norm was NaN!    a message after a record

Each regex is applied to a bounded window, with bounded repeats only: linear in the line.

    match = frame_error(line)     # the `Exception: message` glued after a frame's code line (groups exc, msg), or None
    place(hit, line)              # a message glued after a progress record: the record's epoch and batch, in its detail
"""

from __future__ import annotations

import re

WINDOW = 2048  # characters read
# a traceback frame's code line is indented (CPython Lib/traceback.py, StackSummary.format: `    {line}`); the error
# line glued after its closing bracket (not a quote: a string literal may hold `ValueError: `), where the other
# stream's newline was lost
_FRAME_ERROR = re.compile(r"(?<=[)\]])(?P<exc>[A-Z][A-Za-z]{0,60}(?:Error|Exception)): (?P<msg>[^\n]{0,400})")
# a progress record ending in `}` or `|` then the message: `{| Epoch: 13/1250 (3/8) | ... | }`
# (MockingBird's synthesizer prints the record with end="" and its own messages after it)
_RECORD = re.compile(r"Epoch:? {0,3}(?P<epoch>\d{1,9})(?:/\d{1,9})? {0,3}\((?P<batch>\d{1,9}/\d{1,9})\)")
_CLOSED = re.compile(r"\|\s{0,8}\}(?=[A-Za-z])")  # the record's close, `| }`, glued to a word


def frame_error(line: str) -> re.Match | None:
    """The error line glued onto an indented frame code line (`    main(args)RuntimeError: ...`): its `exc` and `msg`
    groups; None: the line is not indented, or holds no glued error."""
    if not line[:1].isspace() or not line.strip():
        return None
    return _FRAME_ERROR.search(line, 0, WINDOW)


def place(hit, line: str) -> None:
    """A NaN message glued after a progress record (`{| Epoch: 13/1250 (3/8) | ... | }grad_norm was NaN!`): the
    record's epoch and batch, said in the hit's detail (the step the record names none of)."""
    if hit.signal.id != "nonfinite-message" or hit.step is not None or "}" not in line[:WINDOW]:
        return
    close = _CLOSED.search(line, 0, WINDOW)
    match = None if close is None else _RECORD.search(line, 0, close.start())
    if match is not None:
        said = f"epoch {match['epoch']}, batch {match['batch']}: the progress record it is glued after"
        hit.detail = f"{hit.detail} ({said})"
