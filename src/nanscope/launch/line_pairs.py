"""A metric line's (key, value, where) pairs, by its shape: a Python dict's quoted keys, `|`-separated fields,
`key: value` / `key=value` / `key value` (launch.line_shapes' spaced, bracketed and MetricLogger shapes first).

    pairs("step 3 | loss nan | grad_norm 1.2")   # [('step', '3', 5), ('loss', 'nan', 14), ('grad_norm', '1.2', 30)]

Each regex is bounded and runs on the line's first WINDOW characters: linear in the line.
"""

from __future__ import annotations

import re

from nanscope.launch import line_shapes as shapes

WINDOW = 8192  # characters of a line parsed
# a value; `nan`/`inf` right before `=` or `:` is a key (`nan=True inf=False`: a check's flags, holdout20 10;
# Marian's `Cost nan : Time` spaces its separator)
_VALUE = r"'[^'\n]{0,40}'|\"[^\"\n]{0,40}\"|[-+]?(?:(?:nan(?:\.0)?|inf(?:inity)?)(?![:=])|\d[\d.]{0,40}(?:[eE][-+]?\d{1,4})?)(?![A-Za-z_])"
_QUOTED = re.compile(
    rf"(?P<key>'[^'\n]{{1,120}}'|\"[^\"\n]{{1,120}}\")\s{{0,8}}:\s{{0,8}}(?P<value>{_VALUE})", re.IGNORECASE
)
_PLAIN = re.compile(rf"(?<![\w./()-])(?P<key>[A-Za-z_][\w./()\[\]-]{{0,100}})(?:\s{{0,3}}[:=]\s{{0,30}}|\s{{1,3}})(?P<value>{_VALUE})", re.IGNORECASE)  # fmt: skip
_FIELD = re.compile(rf"\s{{0,40}}(?P<key>[A-Za-z_][\w ./()\[\]-]{{0,100}}?)\s{{0,3}}[:=]?\s{{1,40}}(?P<value>{_VALUE})(?:/\s{{0,12}}\d{{1,12}}|\s{{0,3}}(?:ms|s|%))?", re.IGNORECASE)  # fmt: skip
_FIELD_WHOLE = re.compile(_FIELD.pattern + r".?\Z", re.IGNORECASE)  # a field to its end (one stray character)
_WRAP = re.compile(r"\s{2,40}[-\d]?")  # a terminal's wrap inside a quoted key, and the stray character after it


# a verb between a name and its value (`log_prob is nan`: yifan123/flow_grpo#177, holdout18 01): the name is the key
_COPULAS = frozenset(("is", "was", "are", "were", "became", "becomes", "got"))
_SUBJECT = re.compile(r"(?<![\w./-])(?P<key>[A-Za-z_][\w./-]{0,100})\s{1,3}\Z")
# a split's word before its metric (`train loss nan, val loss nan`: karpathy/nanoGPT train.py's eval line, holdout17
# 21): the key is the split and the metric, not the metric alone
_SPLIT = re.compile(
    r"(?:^|(?<=[\s,;:|(]))(?P<split>train|training|val|valid|validation|eval|test|dev)\s\Z", re.IGNORECASE
)


# words that are no metric's name (`number of nan iterations:` cut or wrapped after `nan`: holdout19 10, an OCR'd
# Megatron log; `found nan in`, `contains nan or`): the value after one is a word of the sentence
_FUNCTION_WORDS = frozenset(("of", "the", "a", "an", "no", "any", "for", "in", "on", "at", "with", "to", "from", "by",
                             "and", "or", "not", "found", "contains", "contain", "has", "have", "had", "detected",
                             "encountered", "produced", "returned", "either"))  # fmt: skip


def _function_word(text: str, match) -> bool:
    """A plain match whose key is a word of a sentence, written `key value` with no `:` or `=` between."""
    between = text[match.end("key") : match.start("value")]
    return match["key"].lower() in _FUNCTION_WORDS and ":" not in between and "=" not in between


def _subject(text: str, match) -> str:
    """A plain match's key, or the name before it where the key is a verb (`log_prob is nan`: log_prob)."""
    key = _key(match["key"])
    if key.lower() not in _COPULAS:
        split = _SPLIT.search(text, max(0, match.start("key") - 12), match.start("key"))
        return f"{split['split']} {key}" if split is not None else key
    before = _SUBJECT.search(text, max(0, match.start("key") - 104), match.start("key"))
    return before["key"] if before is not None else key


def _key(text: str) -> str:
    """A key as printed, without its quotes and a terminal's wrap inside it."""
    text = text.strip().strip("'\"")
    return _WRAP.sub("", text) if "  " in text else text


def pairs(line: str) -> list[tuple[str, str, int]]:
    """(key, value, where) of a metric line, in order, by its shape: quoted keys (with the plain `key=value` pairs
    around a dict), `|` fields (where at least two parse), else `key: value` / `key=value` / `key value`."""
    text = line[:WINDOW]
    if "{'" in text or '{"' in text or "': " in text or '": ' in text:
        quoted = [(_key(m["key"]), m["value"], m.start("value"), m.start()) for m in _QUOTED.finditer(text)]
        spans = [(start, at) for _, _, at, start in quoted]
        plain = [
            (_key(m["key"]), m["value"], m.start("value"))
            for m in _PLAIN.finditer(text)
            if not any(start <= m.start() <= at for start, at in spans)
            and "'" not in m["key"]
            and not _function_word(text, m)
        ]
        return sorted([(key, value, at) for key, value, at, _ in quoted] + plain, key=lambda item: item[2])
    if text.count("|") >= 2:
        out, at = [], 0
        for part in text.split("|"):
            match = _FIELD_WHOLE.match(part.rstrip())  # the whole field: `number of nan iterations: 0`, not `... nan`
            if match is not None:
                out.append((_key(match["key"]), match["value"], at + match.start("value")))
            at += len(part) + 1
        if len(out) >= 2:
            return out
    found = shapes.spaced(text) or shapes.bracketed(text)
    if not found:
        plain = [m for m in _PLAIN.finditer(text) if not _function_word(text, m)]
        named = shapes.worded(text, plain)  # `KL divergence: nan`: a name of several words
        named.update(shapes.grouped(text, plain))  # `Reward: mean=nan`, `train_loss[loss=nan`: a group's keys
        found = [(named.get(i) or _subject(text, m), m["value"], m.start("value")) for i, m in enumerate(plain)]
    extra = shapes.averages(text)  # MetricLogger's `median (global_avg)`: a non-finite mean since the start
    return sorted(found + extra, key=lambda item: item[2]) if extra else found
