"""The step of a first non-finite metric line that names none by a step key, from the counters an ad hoc training
loop prints beside its metrics, and the names of metrics written with spaces:

    Epoch:[0/2](7000/293491) loss:nan lr:0.0000987               the iteration in parentheses after the epoch: 7000
    000 epoch, 06000 iter, average time 0.6607, loss nan          the number before its counter's name: iter 6000
    0 epoch,  153  batch, Discriminator  Loss:  nan               batch 153 (the finer counter), "Discriminator Loss"
    Epoch: 0564 D loss: nan G loss: nan                           epoch 564 (the only counter: no step), "D loss"...
    Epoch    :  8                                                 a counter's line alone, just before the metric's
    LOSS     :  nan                                               line: epoch 8
    Epoch 2/10                                                    Keras's epoch line, then its finished progress bar
    9595/9595 [==============================] - 1s - loss: nan   (Progbar): epoch 2 (no step)
    9/500 [..............................] - ETA: 43:03 - loss: nan   a bar inside its epoch: batch 9

A counter is one of COUNTERS next to its number, either order; of several on a line the finest (an iteration, a
batch, a step) is the step. An epoch, where it is the only one and the lines before count one epoch a line, is said
as the reading's epoch, not as a step (the bad step within it the line does not say). Each regex has bounded repeats
only and is applied to a line's first WINDOW characters: linear in the line.

    fill(reading, text, before)       # reading.step (or .epoch) from `text` or `before` (the lines just before it)
    rename(reading, text)             # `Loss` -> `Discriminator Loss`, `loss` -> `D loss`; the model a name says
"""

from __future__ import annotations

import re
from typing import NamedTuple

from nanscope.facts.metric_names import NAME_MODELS, STATISTIC_WORDS
from nanscope.launch import epoch_steps

WINDOW = 2048  # characters of a line read
_WORD = r"(?P<word>epoch|iteration|iter|batch|step)"
# `Epoch: 0564`, `iter 06000`, `Epoch:[0/2]` (word then number, an optional `[`, `:`, `=`, `#`)
_WORD_FIRST = re.compile(
    rf"(?<![\w./-]){_WORD}\s{{0,8}}[:=#]?\s{{0,8}}\[?\s{{0,4}}(?P<n>\d{{1,12}})(?:\s{{0,4}}/\s{{0,4}}\d{{1,12}})?(?![\w.])",
    re.IGNORECASE,
)
# `06000 iter`, `153  batch` (number then word)
_NUMBER_FIRST = re.compile(rf"(?<![\w./:-])(?P<n>\d{{1,12}})\s{{1,8}}{_WORD}(?=\s{{0,4}}[,:;|\]])", re.IGNORECASE)
# baby-llama2-chinese's `Epoch:[0/2](7000/293491)`: the iteration within the epoch in parentheses after it
_EPOCH_PAREN = re.compile(
    r"epoch\s{0,4}:?\s{0,4}\[\d{1,12}/\d{1,12}\]\s{0,4}\((?P<n>\d{1,12})/\d{1,12}\)", re.IGNORECASE
)
# a line holding a counter alone (`Epoch    :  8`, `Epoch 2/10`, `[12:00:01] iter 300`)
_ALONE = re.compile(
    rf"\s{{0,40}}(?:\[[^\]\n]{{0,60}}\]\s{{0,4}})?{_WORD}s?\s{{0,8}}[:=#]?\s{{0,8}}(?P<n>\d{{1,12}})"
    r"(?:\s{0,4}/\s{0,4}(?P<total>\d{1,12}))?\s{0,4}\Z",
    re.IGNORECASE,
)
# Keras's Progbar line (keras/utils/generic_utils.py Progbar.update: `current/target [====>....] - ETA: ... - key:
# value`): the batch count within the epoch and the epoch's batches
_PROGBAR = re.compile(r"\s{0,12}(?P<n>\d{1,12})/(?P<total>\d{1,12}) \[[=>.]{1,200}\] - ")
_FINE = ("iteration", "iter", "batch", "step")
BEFORE = 2  # lines before a metric line read for a counter's line alone


class Counted(NamedTuple):
    """A metric line's count and how it was read; `epoch`: the count is an epoch's (said as the epoch, not a step)."""

    count: int
    how: str
    epoch: bool = False


def _own(text: str, before: tuple[str, ...] | list[str] = ()) -> Counted | None:
    """The step `text` gives itself by a counter next to its number (the finest of several; an epoch alone only where
    the lines `before` it do not count epochs otherwise than one a line)."""
    head = text[:WINDOW]
    paren = _EPOCH_PAREN.search(head)
    if paren is not None:
        return Counted(int(paren["n"]), f"the line's iteration within its epoch ({paren.group(0)})")
    found = [
        (m["word"].lower(), m["n"], m.start())
        for pattern in (_WORD_FIRST, _NUMBER_FIRST)
        for m in pattern.finditer(head)
    ]
    if not found:
        return None
    found.sort(key=lambda item: (item[0] not in _FINE, item[2]))
    word, number, _ = found[0]
    if word == "epoch" and not epoch_steps.one_a_line(int(number), list(before)):
        return None  # several lines per epoch, or a gap: the epoch says nothing of the step
    unit = "the epoch is the unit: its only counter" if word == "epoch" else f"its {word} counter"
    return Counted(int(number), f"the line ({word} {number}: {unit})", word == "epoch")


def _alone(line: str) -> tuple[str, int, int | None] | None:
    match = _ALONE.match(line[:400])
    if match is None:
        return None
    return match["word"].lower(), int(match["n"]), None if match["total"] is None else int(match["total"])


def step_of(text: str, before: list[str]) -> Counted | None:
    """The count of the metric line `text` (`before`: the lines just before it, in order): its step, or its epoch
    where that is its only counter; None: none."""
    bar = _PROGBAR.match(text[:WINDOW])
    header = next(((line, found) for line in before[::-1][:BEFORE] if (found := _alone(line)) is not None), None)
    if bar is not None:
        count, total = int(bar["n"]), int(bar["total"])
        if header is not None and header[1][0] == "epoch" and count == total:
            return Counted(header[1][1], f"the epoch: Keras's `{header[0].strip()}` line before its finished progress "
                           f"bar {count}/{total} (an epoch's metrics are printed on its last bar)", True)  # fmt: skip
        said = f" of epoch {header[1][1]}" if header is not None and header[1][0] == "epoch" else ""
        return Counted(count, f"the line (Keras's progress bar {count}/{total}: batch {count}{said})")
    own = _own(text, before)
    if own is not None:
        return own
    if header is not None:
        word, number, _ = header[1]
        return Counted(number, f"the line before it ({header[0].strip()[:60]!r}: {word} {number})", word == "epoch")
    return None


def fill(reading, text: str, before: list[str]) -> bool:
    """Give a first reading without a step (none named, none before) the step its loop's counters say; True if so
    (an epoch, its only counter, is its epoch instead)."""
    if reading.step is not None or reading.after is not None:
        return False
    found = step_of(text, before)
    if found is None:
        return False
    if found.epoch:  # an epoch is no step: said as the epoch (the first bad step within it the line does not say)
        reading.epoch = reading.epoch or str(found.count)
        return False
    reading.step, reading.step_from = found.count, found.how
    return True


# a loss's key and its value (`Loss:  nan`, `loss: nan`), and the one word written before the key (`Discriminator  `)
_KEYED = re.compile(r"(?<![\w./-])(?P<key>loss|cost|error)\s{0,4}[:=]\s{0,30}(?P<value>[-+]?[A-Za-z]{3,8})(?![\w.])", re.IGNORECASE)  # fmt: skip
_HEAD = re.compile(r"(?<![\w./,:;=-])(?P<head>[A-Za-z][A-Za-z_]{0,30})\s{1,4}\Z")
# ... no name's word: a counter's, a sentence's, or the value of the pair before it (`grad_norm: nan  loss: nan`, MMEngine's
# fields two spaces apart: AILab-CVC/YOLO-World#614, holdout25 20)
_COUNTER_WORDS = frozenset(("epoch", "iter", "iteration", "batch", "step", "total", "avg", "average", "mean", "train",
                            "val", "valid", "test", "eval", "the", "and", "of", "is", "nan", "inf", "infinity"))  # fmt: skip


def rename(reading, text: str) -> None:
    """The non-finite values' keys as the line writes them, with the words before the key (`Discriminator  Loss:`
    is "Discriminator Loss", not "Loss"); the model where those words name a GAN's discriminator or generator."""
    names: dict[str, list[str | None]] = {}  # key -> the name of each of its non-finite values, in order
    for match in _KEYED.finditer(text, 0, WINDOW):
        if match["value"].lower().lstrip("+-") not in ("nan", "inf", "infinity"):
            continue
        head = _HEAD.search(text, max(0, match.start() - 40), match.start())
        spelled = head is not None and head["head"].lower() not in _COUNTER_WORDS
        names.setdefault(match["key"], []).append(f"{head['head']} {match['key']}" if spelled else None)
    if not names:
        return
    values, used = [], {}
    for key, value in reading.values:
        spelled = names.get(key, [])
        index = used.get(key, 0)
        used[key] = index + 1
        values.append((spelled[index], value) if index < len(spelled) and spelled[index] else (key, value))
    reading.values = values
    models = {spelled_model(key) for key, value in values if " " in key and value != "missing"}
    if len(models) == 1 and None not in models:
        reading.model = models.pop()


def spelled_model(name: str) -> str | None:
    """The model a spelled-out name's first word names (`Mean value_function loss`: the critic), or None."""
    return NAME_MODELS.get(_first_word(name))


def _first_word(name: str) -> str:
    """A name's first word, lowered, past a statistic's (`Mean value_function loss`: value_function)."""
    words = name.lower().split()
    return words[1] if len(words) > 1 and words[0] in STATISTIC_WORDS else words[0]
