"""A metric record printed as indented JSON, one key a line (transformers' trainer_state.json `log_history`, a
`json.dumps(..., indent=2)` of a step's metrics, or a Python dict so printed), joined back into one line:

    {
      "epoch": 0.0,
      "grad_norm": NaN,          <- a candidate line (its NaN): the record around it is read whole
      "loss": 9078019.2,
      "step": 5                  <- the step, after the values
    },

Only an object of scalar members is joined (a nested object or list ends the walk), at most MAX_MEMBERS lines each
way: linear in the log.

    found = record(block, start, end, clean)   # (joined text, where the object ends, where its `{` line starts), or None
"""

from __future__ import annotations

import re

MAX_MEMBERS = 64  # lines of one object, each way from the candidate line
# a member's key in JSON's double quotes, or in a Python dict's single ones (a Trainer dict pretty-printed a key a line,
# `pprint`/`json`-style: huggingface/transformers#31997, holdout24 03)
_MEMBER = re.compile(r"""\s{0,40}(?:"[^"\n]{1,120}"|'[^'\n]{1,120}')\s{0,4}:\s{0,4}[^\s{\[][^\n]{0,200}""")
_OPEN = re.compile(r"\s{0,40}\{\s{0,4}")
_CLOSE = re.compile(r"\s{0,40}\},?\s{0,4}")


def _line(block: bytes, start: int, end: int, clean) -> str:
    return clean(block[start:end][:4096].decode("utf-8", "replace"))


def record(block: bytes, start: int, end: int, clean) -> tuple[str, int, int] | None:
    """The JSON object the member line at block[start:end] is in, as one line; None: it is no such member."""
    text = _line(block, start, end, clean)
    if not _MEMBER.fullmatch(text):
        return None
    members, first, at = [text.strip().rstrip(",")], None, start - 1
    for _ in range(MAX_MEMBERS):  # back to the `{` line
        if at <= 0:
            return None
        begin = block.rfind(b"\n", 0, at) + 1
        before = _line(block, begin, at, clean)
        if _OPEN.fullmatch(before):
            first = begin
            break
        if not _MEMBER.fullmatch(before):
            return None
        members.insert(0, before.strip().rstrip(","))
        at = begin - 1
    if first is None:
        return None
    stop = end
    for _ in range(MAX_MEMBERS):  # on to the `}` line
        if stop >= len(block):
            return None
        nxt = block.find(b"\n", stop + 1)
        nxt = len(block) if nxt < 0 else nxt
        after = _line(block, stop + 1, nxt, clean)
        stop = nxt
        if _CLOSE.fullmatch(after):
            return "{" + ", ".join(members) + "}", stop, first
        if not _MEMBER.fullmatch(after):
            return None
        members.append(after.strip().rstrip(","))
    return None
