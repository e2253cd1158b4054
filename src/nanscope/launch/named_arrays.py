"""A bracketed list of names over a printed array of values, each value named by its position:

    Global Step : 67438, [55, 100] [Total Loss, KL Loss, Reg Loss, Frame Loss] : [  nan   nan 2.301   nan]

(ksw0306/ClariNet train_student.py: `print('Global Step : {}, [{}, {}] [Total Loss, KL Loss, Reg Loss, Frame Loss]
: {}'.format(global_step, epoch, batch_idx + 1, np.array(running_loss)))`, numpy's array printed with spaces.)
Read as `Total Loss: nan, KL Loss: nan, Reg Loss: 2.301, Frame Loss: nan` and the `Global Step : N` before them.
Only when the names and the values are as many; every regex bounded, no bracket inside a bracket: linear.

    found = read(text)     # [(key, value, where)], [] where the line holds no such list
"""

from __future__ import annotations

import re

WINDOW = 8192
_NAMES_VALUES = re.compile(
    r"\[(?P<names>[A-Za-z][^\[\]\n:=]{0,600})\]\s{0,3}[:=]\s{0,3}\[(?P<values>[^\[\]\n]{1,800})\]"
)
_TOKEN = re.compile(r"[^\s,]{1,60}")
_VALUE = re.compile(r"[-+]?(?:nan|inf(?:inity)?|\d{1,40}\.?\d{0,40}(?:[eE][-+]?\d{1,4})?)\Z", re.IGNORECASE)
_STEP = re.compile(r"(?P<key>(?:Global |global_)?[Ss]tep|[Ii]teration|[Ii]ter)\s{0,2}:\s{0,2}(?P<value>\d{1,12})\b")
_NAME = re.compile(r"[A-Za-z][\w ./-]{0,80}\Z")


def read(text: str) -> list[tuple[str, str, int]]:
    """(name, value, where) for each value of a names-over-values array on `text`, with the step named before it."""
    if "] " not in text[:WINDOW] and "]:" not in text[:WINDOW]:
        return []
    for match in _NAMES_VALUES.finditer(text, 0, WINDOW):
        names = [name.strip() for name in match["names"].split(",")]
        values = list(_TOKEN.finditer(match["values"]))
        if len(names) < 2 or len(names) != len(values) or not all(_NAME.match(name) for name in names):
            continue
        if not all(_VALUE.match(value.group()) for value in values):
            continue
        base = match.start("values")
        found = [(name, value.group(), base + value.start()) for name, value in zip(names, values, strict=True)]
        step = _STEP.search(text, 0, match.start())
        return ([(step["key"], step["value"], step.start("value"))] if step is not None else []) + found
    return []
