"""A training loop's own progress line before an error: the step the error came in, where the error's line names
none and no progress bar is beside it.

    2019-02-15 15:37:57,878 INFO     iteration 27/10000          <- the loop's line, at the start of iteration 27
    2019-02-15 15:40:09,232 INFO      epoch 1/4                  (an epoch inside the iteration: not a step)
    Traceback (most recent call last):
      ...
    ValueError: loss=nan, policy_loss=nan, entropy_loss=nan, advantage_loss=nan     <- step 27

TimZaman/dotaclient (8615b90) optimizer.py:438 logs `iteration {it}/{iterations}` at the start of each iteration and
raises the ValueError at :668 inside it. A line whose message ends in `iteration N[/M]` (also `iter`, `step`) is
such a line; the nearest one within REACH lines before the error gives its step, said as "at or after" (a loop
that prints at a step's end makes it the step before). Each line is read in its last 80 characters: linear.

    step, how = step_before(block, start, number, clean)     # (None, None): no such line
    step, how = episode_before(block, start, number, clean)  # an RL loop's episode line just before a warning
    step, how = tagged_before(block, start, number, clean)   # a phase line tagged `[Global Step: 20]` before a skip
    step, how = iteration_before(block, start, number, clean)  # Megatron's iteration line before its own error
    step, how, epoch = record_before(block, start, number, clean)  # a `key: value` a line record's step key, or
                                                                     # the caption over indented lines (`at step 6:`)
"""

from __future__ import annotations

import re

from nanscope.facts.metric_names import STEP_KEYS

REACH = 40  # lines looked at before an error line
_TAIL = 80  # characters of a line's end read
_PROGRESS = re.compile(
    r"(?<![\w/.-])(?P<word>iteration|iter|step)\s{0,4}[:=#]?\s{0,4}(?P<step>\d{1,12})(?:\s{0,4}/\s{0,4}\d{1,12})?\s{0,4}\Z",
    re.IGNORECASE,
)


# Megatron's iteration line's head (`[2024-09-18 11:14:25] iteration      428/    5000 |`): its step, logged once the
# iteration is done (Megatron-LM core_v0.15.0rc0 megatron/training/training.py:2403-2438: train_step, then `iteration += 1`;
# :2473 training_log prints it, :1816)
MEGATRON_HEAD = re.compile(
    r"\s{0,40}(?:\[[^\]\n]{0,40}\]\s{0,4})?iteration\s{1,20}(?P<step>\d{1,12})\s{0,4}/\s{0,12}\d{1,12}\s{0,4}\|"
)


def progress(line: str) -> int | None:
    """The step a loop's progress line announces (`iteration 27/10000`), or None."""
    tail = line.rstrip()[-_TAIL:]
    match = _PROGRESS.search(tail)
    return None if match is None else int(match["step"])


def _lines_before(block: bytes, start: int, reach: int):
    """(how many lines back, where it begins, where it ends) of each of the `reach` lines of `block` before the line
    at `start`, nearest first."""
    end, seen = start - 1, 0
    while end > 0 and seen < reach:
        begin = block.rfind(b"\n", 0, end) + 1
        seen += 1
        yield seen, begin, end
        end = begin - 1


def step_before(block: bytes, start: int, number: int, clean) -> tuple[int | None, str | None]:
    """The step of the error line at `start` (the log's line `number`) from the nearest progress line before it."""
    for seen, begin, end in _lines_before(block, start, REACH):
        text = clean(block[max(begin, end - 4 * _TAIL) : end].decode("utf-8", "replace"))
        step = progress(text)
        if step is not None:
            shown = text.strip()[-60:]
            return step, (f"the loop's progress line {seen} line(s) before it, line {number - seen}: {shown!r}: "
                          f"at or after step {step}")  # fmt: skip
    return None, None


# an RL loop's episode counter as a field of its line (nnaisense/MAX#1, holdout8 13: the act logger's
# `11:01:08 | INFO | act | \tep: 63\taverage step return: 4.18e13`, then imagination.py's UserWarning "NaN in sampled
# next states!"): `ep: 63`, `episode 63`, `Episode: 63`, a field of its own (a tab, a comma, a bar or the line's end
# after it)
_EPISODE = re.compile(r"(?:^|[\s|,;])(?:ep|episode)\s{0,2}[:=#]?\s{0,4}(?P<step>\d{1,12})(?=[\t,;|]|\s{2}|\s{0,4}\Z)",
                      re.IGNORECASE)  # fmt: skip
EPISODE_REACH = 5  # lines looked at before a warning


def episode_before(block: bytes, start: int, number: int, clean) -> tuple[int | None, str | None]:
    """The episode of a warning at `start` (the log's line `number`) from an episode line at most EPISODE_REACH
    lines before it."""
    for seen, begin, end in _lines_before(block, start, EPISODE_REACH):
        text = clean(block[begin : min(end, begin + 4 * _TAIL)].decode("utf-8", "replace"))
        match = _EPISODE.search(text)
        if match is not None:
            step = int(match["step"])
            return step, (f"the episode line {seen} line(s) before it, line {number - seen}: "
                          f"{match.group().strip()!r}: in or after episode {step}")  # fmt: skip
    return None, None


# a loop's phase line tagged with its step at the line's start (EvolvingLMMs-Lab/multimodal-search-r1#19, a verl
# fork, holdout16 01: `[Global Step: 20] Update Actor Ends ...`, then verl's actor prints `WARN: rank 0 grad_norm
# is not finite: inf`); `Global` required: a plain `[Step 9] eval` may be any loop's
_TAGGED = re.compile(
    r"\[\s{0,2}global[ _](?:step|iteration|iter)\s{0,2}[:=#]?\s{0,2}(?P<step>\d{1,12})\s{0,2}\]", re.IGNORECASE
)


def tagged_before(block: bytes, start: int, number: int, clean) -> tuple[int | None, str | None]:
    """The step of a line at `start` (the log's line `number`) from a line tagged `[Global Step: N]` at most
    EPISODE_REACH lines before it."""
    for seen, begin, end in _lines_before(block, start, EPISODE_REACH):
        text = clean(block[begin : min(end, begin + _TAIL)].decode("utf-8", "replace"))
        match = _TAGGED.match(text.lstrip())
        if match is not None:
            step = int(match["step"])
            return step, f"the phase line {seen} line(s) before it, line {number - seen}: tagged {match.group()!r}"
    return None, None


def iteration_before(block: bytes, start: int, number: int, clean) -> tuple[int | None, str | None]:
    """The iteration of the nearest Megatron iteration line within REACH lines before the error line at `start` (the
    log's line `number`): the error came after that iteration was done, in a later one."""
    for seen, begin, end in _lines_before(block, start, REACH):
        if b"checkpoint" in block[begin:end].lower():  # a load in between: the iteration before it is another run's
            return None, None
        match = MEGATRON_HEAD.match(clean(block[begin : min(end, begin + 4 * _TAIL)].decode("utf-8", "replace")))
        if match is not None:
            return int(match["step"]), (f"Megatron's iteration line {seen} line(s) before it (line {number - seen}) "
                                        "logged that iteration done")  # fmt: skip
    return None, None


# one `key: value` (or `key = value`) a line: a record printed a key per line (a W&B run summary's `_step: 218`,
# transformers' `***** eval metrics *****` block's `  epoch = 0.0`)
_RECORD_LINE = re.compile(
    r"\s{0,8}(?P<key>[A-Za-z_][\w./ -]{0,80}?)\s{0,30}[:=]\s{0,30}(?P<value>[^\s:=]{1,60})\s{0,8}\Z"
)
RECORD_REACH = 64  # lines of a record looked at before its non-finite line
# a record's banner naming its counter, the line above its `key: value` lines (pat-coady/trpo's
# `***** Episode 31455, Mean R = 28911.0 *****`: pat-coady/trpo#21, holdout23 13; PPO-for-Beginners' `----- Iteration
# #50 -----`: ericyangyu/PPO-for-Beginners#1, holdout23 15)
_HEADER = re.compile(
    r"\s{0,8}[*=#~-]{3,}\s{0,4}(?P<unit>episode|iteration|iter|step|update|epoch)\s{0,2}[#:]?\s{0,2}(?P<count>\d{1,12})"
    r"\b[^\n]{0,200}?[*=#~-]{3,}\s{0,8}\Z",
    re.IGNORECASE,
)


# a caption over a record's indented lines, naming its step (`Eval metrics at step 6:` over `  Reward: mean=nan, ...`,
# holdout25 15)
_CAPTION = re.compile(
    r"[^\n]{0,80}?\b(?P<unit>step|iteration|iter|update|episode)\s{0,2}#?\s{0,2}(?P<count>\d{1,12})\s{0,2}:\s{0,8}\Z",
    re.IGNORECASE,
)


def _header(text: str, number: int, epoch: str | None) -> tuple[int | None, str | None, str | None]:
    """The counter a record's banner line (the log's line `number`), or its caption (`Eval metrics at step 6:`),
    names: (step, how, epoch)."""
    match = _HEADER.match(text)
    if match is None:
        caption = _CAPTION.match(text)
        if caption is None:
            return None, None, epoch
        how = f"the caption over it, line {number}: `{text.strip()[:80]}`, its {caption['unit'].lower()} count"
        return int(caption["count"]), how, epoch
    unit, count = match["unit"].lower(), match["count"]
    if unit == "epoch":
        return None, None, epoch or count
    return int(count), f"the record's banner, line {number}: `{text.strip()[:80]}`, its {unit} count", epoch


def _caption(block: bytes, start: int, number: int, clean) -> tuple[int | None, str | None, str | None]:
    """The step a caption (or a banner) names over the indented lines the line at `start` is one of: the first
    unindented line back, within RECORD_REACH."""
    for seen, begin, end in _lines_before(block, start, RECORD_REACH):
        head = block[begin : min(end, begin + 4 * _TAIL)]
        if not head.startswith((b"  ", b"\t")):
            return _header(clean(head.decode("utf-8", "replace")), number - seen, None)
    return None, None, None


def record_before(block: bytes, start: int, number: int, clean) -> tuple[int | None, str | None, str | None]:
    """The step (or the epoch) a record printed a key per line names on a line before its non-finite line at `start`
    (the log's line `number`): the lines back to a blank one or one of another shape; for an indented line of another
    shape, a caption over it. (step, how, epoch)."""
    epoch = None
    stop = block.find(b"\n", start)
    line = block[start : len(block) if stop < 0 else stop][: 4 * _TAIL]
    if _RECORD_LINE.match(clean(line.decode("utf-8", "replace"))) is None:
        indented = line.startswith((b"  ", b"\t"))  # a record's line under its caption
        return _caption(block, start, number, clean) if indented else (None, None, None)
    for seen, begin, end in _lines_before(block, start, RECORD_REACH):
        text = clean(block[begin : min(end, begin + 4 * _TAIL)].decode("utf-8", "replace"))
        match = _RECORD_LINE.match(text)
        if match is None:
            return _header(text, number - seen, epoch)
        key, value = match["key"].strip(), match["value"]
        if key.lower() in STEP_KEYS and value.isdigit():  # exact: not a banner's `Total optimization steps = 750`
            return int(value), f"the record it is in (line {number - seen}: `{key}: {value}`)", None
        if key.lower() == "epoch" and epoch is None:
            epoch = value
    return None, None, epoch
