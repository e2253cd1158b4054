"""A column of scalar tensors, one printed a line: a loop printing its loss each iteration (`print(loss)` in a
fine-tuning loop), whose first non-finite value is the step it went non-finite (lich99/ChatGLM-finetune-LoRA#32,
holdout9 13: `for i in range(10): ... print(loss.detach().float())` printed 3.2207, then nan nine times):

    tensor(3.2207, device='cuda:0')
    tensor(nan, device='cuda:0')        <- the 2nd value: index 1 of a loop counted from 0

Only where the non-finite value's line is such a tensor alone and at least one finite one is printed the same way
just before it (a single printed tensor is no column). A column that starts at the input's first line gives its index
from 0; one that starts later, or across the reader's block, gives "at or after". Each line is matched with bounded
repeats only: linear.

    step, how = column_step(block, start, number, clean, text)     # None: no column
"""

from __future__ import annotations

import re

LIMIT = 100_000  # lines of a column walked back
_SCALAR = re.compile(
    r"\s{0,8}tensor\(\s{0,4}[-+]?(?:\d{1,40}(?:\.\d{0,40})?(?:[eE][-+]?\d{1,4})?|nan|inf)\s{0,4}(?:,[^()\n]{0,200})?\)"
    r"\s{0,8}\Z"
)


def scalar(text: str) -> bool:
    """Whether `text` is one scalar tensor's repr alone (`tensor(nan, device='cuda:0', grad_fn=<...>)`)."""
    return "tensor(" in text[:40] and _SCALAR.match(text[:400]) is not None


def _ordinal(n: int) -> str:
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{tail}"


def column_step(block: bytes, start: int, number: int, clean, text: str) -> tuple[int, str] | None:
    """(the step, where it came from) of the non-finite scalar at `start` (the log's line `number`, `text`) from the
    column of scalars printed before it in `block`; None: it is no column's value."""
    if not scalar(text):
        return None
    count, end = 0, start - 1
    while end >= 0 and count < LIMIT:
        begin = block.rfind(b"\n", 0, end) + 1
        if not scalar(clean(block[begin : min(end, begin + 400)].decode("utf-8", "replace"))):
            break
        count, end = count + 1, begin - 1
    if count == 0:
        return None
    first = number - count
    said = (f"the {_ordinal(count + 1)} scalar printed one a line from line {first}, a loop's value each iteration, "
            f"the {count} before it finite")  # fmt: skip
    if first == 1:
        return count, f"{said}: index {count} of a loop counted from 0"
    return count, f"{said}: at or after index {count} (the column may start before line {first})"
