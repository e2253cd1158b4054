"""Megatron's error line for a NaN/Inf check, in any form it has printed (`facts.wordings.FORMS`).

    raise        Rank R, node N, device D, iteration I: Unexpected result X (message='M')   (core 0.12 on)
    assert       Rank R: M. Device: D, node: N                                              (core 0.4 to 0.9)
    log-at-file  Unexpected result X at FILE line L, invokation #S at iteration #I (message='M')
    log-on-rank  Unexpected result X on rank R at iteration #I invokation #S (message='M')
    tracker      ts=T node=N device=D jobID=J rank=R iteration=I status=S result=X message='M'
    message      M alone

It is found anywhere in a line (after `RuntimeError:`, inside a Ray `RayTaskError`, behind any log prefix), with or
without its prefix, with or without quotes, and cut at any point (marked truncated; the last line of a text may end
inside the `Rank R, node N, ...` prefix itself). Its message names the check that rejected the result
(`facts.megatron.CHECKS`). What the text does not say is None. Reading is linear in the line's length: markers are
found once, and each is read in a window of bounded size.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from nanscope.errors import UserError
from nanscope.facts import wordings
from nanscope.facts.megatron import BUCKETLESS_NAN, BY_ID, CHECKS, Check, checks_of
from nanscope.facts.signals import Signal, Wording

_RESULT = "Unexpected result "
_END = "')"
# a message's start: ` (message='`, or ` message='` in a paste wrapped by hand that left out its parenthesis
# (holdout19 20: `Unexpected result nan` / `message='found NaN ...'`)
_MESSAGES_AT = re.compile(r" \(message='| message='")
_MAX_DIGITS = 18  # a number with more digits is not a rank, device, iteration or line Megatron prints
_WINDOW = 512  # characters read before a marker (a prefix) or after it (a result, a location)
# `Rank R, node N, device D, iteration I: ` (core 0.12 on), whole; a part of it is read in a window (`_partial`).
_FULL = re.compile(
    r"Rank (?P<rank>\d+), node (?P<node>[^\s,]+), device (?P<device>\d+|cpu), iteration (?P<iteration>-?\d+): "
)
_PARTIAL = re.compile(
    r"(?:Rank (?P<rank>\d{1,18}), )?(?:node (?P<node>[^\s,]+), )?(?:device (?P<device>\d{1,18}|cpu), )?"
    r"(?:iteration (?P<iteration>-?\d{1,18}): )?"
)
_AT_FILE = re.compile(r" at (?P<file>\S+) line (?P<lineno>\d{1,18}), invokation #(?P<invocation>\d{1,18}) at iteration #(?P<iteration>-?\d{1,18})")  # fmt: skip
_ON_RANK = re.compile(r" on rank (?P<rank>\d{1,18}) at iteration #(?P<iteration>-?\d{1,18}) (?P<spelling>invokation|invocation) #(?P<invocation>\d{1,18})")  # fmt: skip
_AT_FILE_CUT = re.compile(r" at (?P<file>\S+) line (?P<lineno>\d{1,18})")
_ON_RANK_CUT = re.compile(r" on rank (?P<rank>\d{1,18})(?: at iteration #(?P<iteration>-?\d{1,18}))?")
# the log forms' locations after the result, whole and cut short (the message must follow a whole one)
_LOCATIONS = (
    (" at ", _AT_FILE, "log-at-file"),
    (" on rank ", _ON_RANK, "log-on-rank"),
    (" at ", _AT_FILE_CUT, "log-at-file"),
    (" on rank ", _ON_RANK_CUT, "log-on-rank"),
)
# A check's message starts here: whole, or cut at its start (`NaN in local forward loss`, an issue title's words).
_FOUND = re.compile(
    r"(?:found )?(?:NaN|Inf) in local (?=grad norm|forward loss)|found unexpected large|(?<=message=')Spiky loss"
)
_ASSERT_RANK = re.compile(r"Rank (?P<rank>\d{1,18}): \Z")
_DEVICE_NODE = re.compile(r"\. Device: (?P<device>\d{1,18}|cpu)(?:, node: (?P<node>[^\s,'\"`)]+))?")
_TRACKER = re.compile(r"node=(?P<node>\S+) device=(?P<device>\S+) jobID=\S+ rank=(?P<rank>\d{1,18}) iteration=(?P<iteration>-?\d{1,18}) status=(?P<status>\S+) result=(?P<result>.*) message='")  # fmt: skip
BUCKETLESS_KEY = "grad-norm-nan-assert"  # facts.wordings.SOURCES key of the DDP buffer's message before buckets
_LOG_RANK = re.compile(r"\[rank(?P<rank>\d{1,18})\]:")  # torchrun's `[rank14]: ` before a line
_CUT = re.compile(r"Rank (?P<rank>\d{1,18}), node (?P<node>[^\s,]+)(?:, device (?P<device>\d{1,18}|cpu)(?:, iteration (?P<iteration>-?\d{1,18}))?)?(?P<rest>.*)")  # fmt: skip
# Each message with `#{bucket}` as a group, to read it at a marker.
_MESSAGES = tuple(
    re.compile(re.escape(message).replace(r"\#\{bucket\}", r"#\d{1,18}"))
    for check in CHECKS
    for message in check.messages
)


class Impossible(UserError):
    """A number no Megatron prints where a rank, device or iteration goes: the line is not a Megatron error line."""


@dataclass
class Failure:
    """One Megatron error line; a field the text does not say is None.

    Attributes:
        kind: what the check rejected: "NaN", "Inf", "large" (a finite value 10 times the largest seen), "?" (a
            result neither NaN nor Inf under a message nanscope does not know), None (not said).
        check: the check its message names (None: not one of facts.megatron.CHECKS, or not said).
        format: which of Megatron's forms (facts.wordings.FORMS ids).
        releases: the megatron-core releases that print this form with this message (facts.wordings.RELEASES).
        ambiguous: a message cut short that fits several checks: the others' ids.
        rank_from: where the rank came from when not from the form itself (a `[rank14]:` log prefix).
    """

    rank: int | None
    node: str | None
    device: int | str | None  # "cpu": megatron-core's torch.cuda.current_device() on CPU (nanscope's harness)
    iteration: int | None
    result: str | None
    kind: str | None
    message: str
    bucket: int | None
    text: str
    truncated: bool = False  # the text ends before the form does: what is there is kept
    line: int = 0  # 1-based line of the text
    check: Check | None = None
    format: str = "raise"
    releases: tuple[str, ...] = ()
    ambiguous: list[str] = field(default_factory=list)
    rank_from: str | None = None
    invocation: int | None = None
    location: str | None = None  # log-at-file: the validate_result caller's FILE:LINE
    # evidence other than Megatron's check (format "signal": facts.signals), and what its line says
    signal: Signal | None = None
    step: int | None = None  # the step the line names, or its progress bar's
    step_from: str | None = None  # where that step came from
    printed_by: Wording | None = None  # whose words the evidence line is (facts.signals.WORDINGS)
    op: str | None = None  # the backward function, assert, collective or exception it names
    output: int | None = None  # anomaly mode: the backward function's output index
    detail: str | None = None
    ranks: list[str] = field(default_factory=list)  # ranks named that are not the failing one (logging, waiting)
    unreleased: str | None = None  # the Megatron-LM main that prints it where its frames fit no release (releases ())


def failures(text: str, origin: str = "traceback") -> Iterator[Failure]:
    """Every Megatron error line in `text`, in order (the last line may be cut inside the prefix).

    Raises:
        UserError: a rank, device or iteration with more digits than any Megatron prints.
    """
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        yield from line_failures(line, number, origin, last=number == len(lines))


def line_failures(line: str, number: int, origin: str, last: bool = False) -> Iterator[Failure]:
    """Errors on one line, left to right, without overlap (`last`: the text's last line, which may be cut short)."""
    reader = _Line(line, number, origin)
    found = list(reader.unexpected()) + list(reader.found())
    if not found and last:
        found = reader.cut()
    log_rank = _LOG_RANK.search(line) if "[rank" in line else None
    for _, failure in sorted(found, key=lambda item: item[0]):
        if failure.rank is None and log_rank is not None:
            failure.rank, failure.rank_from = int(log_rank["rank"]), f"the log prefix {log_rank[0]}"
        yield failure


class _Line:
    """One line's markers, read once; `taken` holds the spans already read as one error."""

    def __init__(self, line: str, number: int, origin: str):
        self.line, self.number, self.origin = line, number, origin
        self.messages = [m.start() for m in _MESSAGES_AT.finditer(line)] if "message=" in line else []
        self.ends = [m.start() for m in re.finditer(re.escape(_END), line)] if "')" in line else []
        self.taken: list[tuple[int, int]] = []  # sorted, never overlapping: a lookup is one bisect

    def unexpected(self) -> Iterator[tuple[int, Failure]]:
        """The forms around `Unexpected result` (raise, log-at-file, log-on-rank): (where it starts, the failure)."""
        line = self.line
        if "Unexpected" not in line:
            return
        full = {match.end(): match for match in _FULL.finditer(line)} if "Rank " in line else {}
        pos = 0
        while (at := line.find("Unexpected", pos)) >= 0:  # the result may be cut right after "Unexpected"
            if not _RESULT.startswith(line[at : at + len(_RESULT)]):
                pos = at + 1
                continue
            prefix = full.get(at) or _partial(line, max(pos, at - _WINDOW), at)
            fields = {} if prefix is None else {k: v for k, v in prefix.groupdict().items() if v is not None}
            self._digits(fields)
            start = at if prefix is None else prefix.start()
            failure, end = self._after_result(at, start, fields)
            bisect.insort(self.taken, (start, end))
            yield start, failure
            pos = max(end, at + 1)

    def _after_result(self, at: int, start: int, fields: dict) -> tuple[Failure, int]:
        """The result, the location (log forms) and the message after `Unexpected result` at `at`."""
        line, begin = self.line, at + len(_RESULT)
        message_at = _next(self.messages, begin + 1)
        bound = begin + _WINDOW if message_at is None else min(begin + _WINDOW, message_at + 1)
        form, stop = "raise", message_at
        for marker, pattern, name in _LOCATIONS:
            i = line.find(marker, begin, bound)
            located = pattern.match(line, i) if i > 0 else None
            if located is not None and (located.end() == message_at or message_at is None):
                form, stop = name, i
                fields.update({k: v for k, v in located.groupdict().items() if v is not None})
                break
        result = line[begin:stop].strip() if stop is not None else line[begin:].split(" (", 1)[0].strip()
        if stop is None or (form != "raise" and _next(self.messages, stop) is None):
            failure = self._make(fields, result=result or None, form=form, span=(start, len(line)), cut=True)
            return failure, len(line)
        body = line.index("message='", _next(self.messages, stop)) + len("message='")  # the message's text
        end = _next(self.ends, body)
        message = line[body:] if end is None else line[body:end]
        span_end = len(line) if end is None else end + len(_END)
        failure = self._make(fields, result=result, form=form, span=(start, span_end), message=message, cut=end is None)
        return failure, span_end

    def found(self) -> Iterator[tuple[int, Failure]]:
        """The forms around a check's message alone (assert, tracker, message), where no `Unexpected` read it."""
        line = self.line
        if " in local " not in line and "found unexpected" not in line and "Spiky loss" not in line:
            return
        for marker in _FOUND.finditer(line):
            at = marker.start()
            if self._taken(at):
                continue
            read = _message_at(line, at)
            if read is None:
                continue
            message, end, cut = read
            start, failure, end = self._around_message(at, message, end, cut)
            bisect.insort(self.taken, (start, end))
            yield start, failure

    def _taken(self, at: int) -> bool:
        """`at` lies inside a span already read (the spans do not overlap: only the last one starting at or before
        `at` can hold it)."""
        i = bisect.bisect_right(self.taken, (at, len(self.line) + 1)) - 1
        return i >= 0 and self.taken[i][0] <= at < self.taken[i][1]

    def _around_message(self, at: int, message: str, end: int, cut: bool) -> tuple[int, Failure, int]:
        """The assert or tracker form around a message at `at` (or the message alone): (start, failure, end)."""
        line = self.line
        low = max(0, at - 40)
        asserted = _ASSERT_RANK.search(line, low, at)
        if asserted is not None:
            fields = {"rank": asserted["rank"]}
            tail = None if cut else _DEVICE_NODE.match(line, end)
            if tail is not None:
                fields.update({k: v for k, v in tail.groupdict().items() if v is not None})
                end = tail.end()
            self._digits(fields)
            start = asserted.start()
            return (
                start,
                self._make(fields, result=None, form="assert", span=(start, end), message=message, cut=cut),
                end,
            )
        if line.endswith("message='", low, at):
            low = max(0, at - _WINDOW)
            node = line.rfind("node=", low, at)
            tracked = _TRACKER.fullmatch(line, node, at) if node >= 0 else None
            if tracked is not None:
                fields = {k: v for k, v in tracked.groupdict().items() if k not in ("result", "status")}
                self._digits(fields)
                failure = self._make(fields, result=tracked["result"], form="tracker", span=(node, end), message=message, cut=cut)  # fmt: skip
                return node, failure, end
        # the message after a part of the raise form's prefix, its `Unexpected result X (message=` left out
        # (`RuntimeError: iteration 103: found NaN in local grad norm for bucket #0`, a NeMo-RL post-mortem's
        # paste, holdout19 11): the rank, node, device and iteration it names
        part = _partial(line, max(0, at - _WINDOW), at)
        fields = {k: v for k, v in part.groupdict().items() if v is not None} if part is not None else {}
        self._digits(fields)
        start = part.start() if fields else at
        return start, self._make(fields, result=None, form="message", span=(start, end), message=message, cut=cut), end

    def cut(self) -> list[tuple[int, Failure]]:
        """The last line of a text cut inside `Rank R, node N, ...`, before `Unexpected result` is complete."""
        at = self.line.rfind("Rank ")
        match = _CUT.match(self.line, at) if at >= 0 else None
        if match is None:
            return []
        rest = match["rest"].strip(" ,:")
        expected = "Unexpected result" if match["iteration"] else "iteration -1" if match["device"] else "device 0"
        if not expected.startswith(re.sub(r"\d+", lambda number: "1" if match["device"] else "0", rest)):
            return []
        fields = {k: v for k, v in match.groupdict().items() if v is not None and k != "rest"}
        return [(at, self._make(fields, result=None, form="raise", span=(at, len(self.line)), cut=True))]

    def _digits(self, fields: dict) -> None:
        for name in ("rank", "device", "iteration"):
            value = fields.get(name)
            if value is not None and len(value.lstrip("-")) > _MAX_DIGITS:
                raise Impossible(
                    f"{self.origin}: line {self.number}: the {name} has {len(value.lstrip('-'))} digits, "
                    "more than Megatron ever prints: not a Megatron error line"
                )

    def _make(self, fields: dict, *, result, form: str, span: tuple[int, int], message: str = "", cut: bool = False):
        text = self.line[span[0] : span[1]]
        return _failure(fields, result=result, form=form, text=text, message=message, cut=cut, number=self.number)


def _partial(line: str, low: int, at: int) -> re.Match | None:
    """The part of `Rank R, node N, device D, iteration I: ` that ends at `at` (a line cut at its start)."""
    for name in ("Rank ", "node ", "device ", "iteration "):
        i = line.rfind(name, low, at)
        if i >= 0:
            match = _PARTIAL.fullmatch(line, i, at)
            if match is not None and match.group(0):
                return match
    return None


def _message_at(line: str, at: int) -> tuple[str, int, bool] | None:
    """The known message that starts at `at`: (its text, where it ends, cut short); None: not one. A message cut at
    its start (`NaN in local ...`) is read as `found NaN in local ...`, cut short."""
    if not line.startswith(("found ", "Spiky"), at):
        read = _message_at("found " + line[at : at + _WINDOW], 0)
        return None if read is None else (read[0], at + read[1] - len("found "), True)
    for pattern in _MESSAGES:
        match = pattern.match(line, at)
        if match is not None:
            return match.group(0), match.end(), False
    rest = line[at : at + _WINDOW].rstrip().rstrip("'\"`)").rstrip().removesuffix("...").removesuffix("\u2026").rstrip()
    if rest and checks_of(rest, truncated=True):
        return rest, at + len(rest), True
    # the line's last word wrapped or misread (`... communication collectie` + `ve. Device: 5`: holdout19 10, a log
    # read off a screenshot): the message cut before that word
    head, _, word = rest.rpartition(" ")
    begun = len(word) >= 3 and checks_of(f"{head} {word[:3]}", truncated=True)  # `collectie` begins `collective`
    if len(head) >= len("found NaN in local grad norm") and begun and checks_of(head, truncated=True):
        return head, at + len(head), True
    return None


def _next(positions: list[int], at: int) -> int | None:
    """The first position >= `at`, or None."""
    i = bisect.bisect_left(positions, at)
    return positions[i] if i < len(positions) else None


def _failure(fields: dict, *, result, form: str, text: str, message: str, cut: bool, number: int) -> Failure:
    """The Failure of one form's fields (strings as read), its result and message."""
    message_cut = cut
    if cut and message:  # the form is cut short; its message may be whole
        message = _trim(message)
        message_cut = not any(_bucket_free(message) == variant for _, variant, _ in VARIANTS)
    checks, releases = resolve(message, message_cut, form, fields.get("spelling"))
    check = checks[0] if checks else None
    if check is not None:
        kind = check.value
    elif result is not None:
        low = (result + " " + message).lower()
        kind = "NaN" if "nan" in low else "Inf" if "inf" in low else "?"
    else:
        kind = None
    bucket = re.search(r"bucket #(\d{1,18})\b", message)
    device = fields.get("device")
    return Failure(
        rank=_int(fields.get("rank")),
        node=fields.get("node"),
        device=None if device is None else int(device) if device.isdigit() else device,
        iteration=_int(fields.get("iteration")),
        result=result,
        kind=kind,
        message=message,
        bucket=int(bucket[1]) if bucket else None,
        text=text,
        truncated=cut,
        line=number,
        check=check,
        format=form,
        releases=releases,
        ambiguous=[other.id for other in checks[1:]],
        invocation=_int(fields.get("invocation")),
        location=f"{fields['file']}:{fields['lineno']}" if "file" in fields else None,
    )


def _int(text: str | None) -> int | None:
    return None if text is None else int(text)


def _trim(message: str) -> str:
    """A message read to the end of a line: without the quotes, brackets and ellipsis a paste leaves after it."""
    return message.rstrip().rstrip("'\"`)]").rstrip().removesuffix("...").removesuffix("\u2026").rstrip()


def _bucket_free(message: str) -> str:
    return re.sub(r"#\d{1,18}\b", "#{bucket}", message) if "#" in message else message


# (check, its message in some releases, facts.wordings.SOURCES key of that message)
VARIANTS: tuple[tuple[Check, str, str], ...] = tuple(
    (check, message, BUCKETLESS_KEY if message == BUCKETLESS_NAN else check.id)
    for check in CHECKS
    for message in check.messages
) + ((BY_ID["forward-loss-nan"], BY_ID["forward-loss-nan"].message, "forward-loss-nan-assert"),)


def resolve(message: str, cut: bool, form: str, spelling: str | None = None) -> tuple[list[Check], tuple[str, ...]]:
    """The checks `message` may be (first the likeliest) and the megatron-core releases that print it in `form`.

    A message cut short may fit several checks; only those some release prints in `form` are kept (a cut
    `found NaN in local grad norm` in core 0.12's raise is the bucket check, not clip_grads' of core 0.5).
    """
    text = _bucket_free(message)
    span = set(wordings.spans(wordings.BY_FORM[form].key)) if wordings.BY_FORM[form].key else set(wordings.RELEASES)
    if spelling is not None:
        old = set(wordings.RELEASES[: wordings.RELEASES.index("0.16.0")])
        span &= old if spelling == "invokation" else set(wordings.RELEASES) - old
    checks, have = [], set()
    for check, variant, key in VARIANTS:
        fits = text == variant or (cut and len(text) >= min(len(variant), 24) and variant.startswith(text))
        if form == "assert" and key not in wordings.ASSERTED.values():
            fits = False
        releases = set(wordings.spans(key)) & span if fits and key in wordings.SOURCES else set()
        if releases:
            have |= releases
            if check not in checks:
                checks.append(check)
    if not message:
        have = span
    return checks, tuple(release for release in wordings.RELEASES if release in have)
