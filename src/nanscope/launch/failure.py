"""The Megatron error line: `Rank R, node H, device D, iteration I: Unexpected result X (message='...')`.

megatron-core's `RerunStateMachine.validate_result` raises it in mode DISABLED (the mode slime runs). It is
found anywhere in a line (bare, after `RuntimeError:`, inside a Ray `RayTaskError` or a log prefix), also
when the line is cut short before its closing `')` (the failure is then marked truncated). Its message names
the check that rejected the result (`facts.megatron.CHECKS`): a bucket's gradient norm NaN, Inf or
unexpectedly large, or Megatron-LM's forward loss NaN, Inf or spiky. Reading is linear in the line's length.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass

from nanscope.errors import UserError
from nanscope.facts.megatron import Check, check_of

# The error line, read in two steps so that reading stays linear in the text's length (one regex with
# lazy groups for the result and the message is cubic on a long line of repeated prefixes):
# `Rank R, node H, device D, iteration I: ` by this regex, the rest by fixed markers.
_PREFIX = re.compile(
    r"Rank (?P<rank>\d+), node (?P<node>[^\s,]+), device (?P<device>\d+|cpu), "
    r"iteration (?P<iteration>-?\d+): "
)
_RESULT = "Unexpected result "
_MESSAGE = " (message='"
_END = "')"
_MAX_DIGITS = 18  # a number with more digits is not a rank, device, iteration or line Megatron prints


@dataclass
class Failure:
    """The Megatron error line.

    Attributes:
        kind: what the check rejected: "NaN", "Inf", "large" (a finite value 10 times the largest seen),
            or "?" (a message nanscope does not know, whose result is neither NaN nor Inf).
        check: the check its message names (None: not one of facts.megatron.CHECKS).
    """

    rank: int
    node: str
    device: int | str  # "cpu": megatron-core's torch.cuda.current_device() on CPU (nanscope's harness)
    iteration: int
    result: str
    kind: str
    message: str
    bucket: int | None
    text: str
    truncated: bool = False  # the line ends before its closing `')`: message (or result) kept as far as it goes
    line: int = 0  # 1-based line of the text
    check: Check | None = None


def failures(text: str, origin: str = "traceback") -> Iterator[Failure]:
    """Every Megatron error line in `text`, in order; one cut short before its `')` is marked truncated.

    Raises:
        UserError: a rank, device or iteration with more digits than any Megatron prints.
    """
    for number, line in enumerate(text.split("\n"), 1):
        if "Rank " in line:
            yield from line_failures(line, number, origin)


def line_failures(line: str, number: int, origin: str) -> Iterator[Failure]:
    """Errors on one line, left to right, without overlap; each marker position is looked up, not rescanned."""
    messages = [marker.start() for marker in re.finditer(re.escape(_MESSAGE), line)]
    ends = [marker.start() for marker in re.finditer(re.escape(_END), line)]
    pos = 0
    while (prefix := _PREFIX.search(line, pos)) is not None:
        start = prefix.end()
        if not line.startswith(_RESULT, start) and not (
            len(line) - start < len(_RESULT) and _RESULT.startswith(line[start:])
        ):
            pos = start  # the same prefix on another kind of Megatron log line
            continue
        result_at = start + len(_RESULT)
        result_end = _next(messages, result_at + 1)  # the result has at least one character
        if result_end is None:
            result, message, end, truncated = line[result_at:].strip(), "", len(line), True
        else:
            message_at = result_end + len(_MESSAGE)
            message_end = _next(ends, message_at)
            truncated = message_end is None
            end = len(line) if truncated else message_end + len(_END)
            result, message = line[result_at:result_end], line[message_at:message_end]
        yield _failure(
            prefix,
            result=result,
            message=message,
            text=line[prefix.start() : end],
            truncated=truncated,
            number=number,
            origin=origin,
        )
        pos = end


def _next(positions: list[int], at: int) -> int | None:
    """The first position >= `at`, or None."""
    i = bisect.bisect_left(positions, at)
    return positions[i] if i < len(positions) else None


def _failure(
    prefix: re.Match, *, result: str, message: str, text: str, truncated: bool, number: int, origin: str
) -> Failure:
    """The failure whose `Rank R, node H, device D, iteration I: ` is `prefix`, on line `number`."""
    for name in ("rank", "device", "iteration"):
        if len(prefix[name].lstrip("-")) > _MAX_DIGITS:
            raise UserError(
                f"{origin}: line {number}: the {name} has {len(prefix[name].lstrip('-'))} digits, "
                "more than Megatron ever prints: not a Megatron error line"
            )
    check = check_of(message, truncated)
    if check is not None:
        kind = check.value
    else:
        low = (result + " " + message).lower()
        kind = "NaN" if "nan" in low else "Inf" if "inf" in low else "?"
    bucket = re.search(r"bucket #(\d{1,18})\b", message)
    return Failure(
        rank=int(prefix["rank"]),
        node=prefix["node"],
        device=int(prefix["device"]) if prefix["device"].isdigit() else prefix["device"],
        iteration=int(prefix["iteration"]),
        result=result,
        kind=kind,
        message=message,
        bucket=int(bucket[1]) if bucket else None,
        text=text,
        truncated=truncated,
        line=number,
        check=check,
    )
