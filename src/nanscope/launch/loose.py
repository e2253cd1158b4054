"""Non-finite values outside the metric-line shapes launch.metric_lines knows, read as `NAME<sep>VALUE` on any line.

    wandb:     loss nan                                                             wandb's run summary
    loss tensor(nan, device='cuda:0', dtype=torch.float16, grad_fn=<MeanBackward0>)  a printed tensor
    chosen reward tensor([nan], device='cuda:0', dtype=torch.float16, ...)          a 1-element tensor, a two-word name
    Loss: nan:   0%|▏        | 2/1000 [00:09<1:09:00,  4.15s/it                      a progress bar's description
     eval_ppl=tensor(nan, device='cuda:0') eval_epoch_loss=tensor(nan, ...)         an epoch summary
    the loss is nan                                                                 a sentence (its subject)

Each NaN/Inf word (`nan`, `NaN`, `NAN`, `inf`, `-inf`, `infinity`, quoted or not) standing alone, not inside a word,
a path (`/data/nan/`), a hex value (`0xnan`) or a dotted name, is read with the name before it: an identifier
(`eval_ppl`, `train/actor/grad_norm`) after `:` or `=`, or up to three words after a field's start (`chosen reward`),
a tensor's `tensor(`/`tensor([` (or an array's) between them. A name that is a common word (`got`, `the`) is no
name; a copula (`is`, `became`) gives the word before it. At most MAX_TOKENS words a line, each read in a window of
REACH characters before it, by hand, backwards: linear in the line.

    found = loose_pairs(line)     # [(name, value, where)], in order; [] where no value has a name
"""

from __future__ import annotations

import re

WINDOW = 8192  # characters of a line read
MAX_TOKENS = 64  # NaN/Inf words read a line
REACH = 160  # characters before a value where its name must be
_TOKEN = re.compile(r"(?<![\w./\\-])[-+]?(?:nan|inf(?:inity)?)(?:\.0)?(?![\w/\\]|\.\w)", re.IGNORECASE)
_WRAPPERS = ("tensor([", "tensor(", "array([", "array(", "[")
_COPULAS = frozenset(("is", "are", "was", "were", "became", "becomes", "become", "becoming", "goes", "went", "turns",
                      "turned", "gets", "got", "being", "remains", "stays"))  # fmt: skip
_STOP = frozenset(("the", "a", "an", "to", "of", "and", "or", "with", "as", "at", "in", "on", "for", "by", "from",
                   "has", "have", "had", "contains", "contain", "found", "detected", "returned", "result", "value",
                   "values", "not", "no", "be", "been", "it", "this", "that", "all", "i", "we", "my", "our", "get",
                   "some", "any", "then", "after", "before", "when", "if", "also", "still", "now", "shows", "show"))  # fmt: skip
_NAME_CHARS = frozenset("_./-[]")
_BOUNDARY = frozenset(",|;{(\t")


def _word_before(text: str, end: int, low: int) -> int:
    """Where the name-like word ending at `end` starts (== end: none), not before `low`."""
    start = end
    while start > low and (text[start - 1].isalnum() or text[start - 1] in _NAME_CHARS):
        start -= 1
    while start < end and not (text[start].isalpha() or text[start] == "_"):  # a name starts with a letter
        start += 1
    return start


def _skip_spaces(text: str, at: int, low: int) -> int:
    while at > low and text[at - 1] in " \t":
        at -= 1
    return at


def _name(text: str, start: int, end: int) -> str | None:
    """The name of the value at `start`:`end`, read backwards (None: none, or a word that is no name)."""
    low, at = max(0, start - REACH), start
    if at > low and text[at - 1] in "'\"":
        at -= 1
    wrapped = next((w for w in _WRAPPERS if text.endswith(w, low, at)), None)
    at -= len(wrapped) if wrapped is not None else 0
    gap = _skip_spaces(text, at, low)
    sep = text[gap - 1] if gap > low and text[gap - 1] in ":=" else None
    if sep is None and gap == at and wrapped is None:
        return None  # glued to what is before it
    at = _skip_spaces(text, gap - 1, low) if sep is not None else gap
    if at > low and text[at - 1] in "'\"":
        at -= 1
    begin = _word_before(text, at, low)
    said = begin < at and text[begin:at].lower() in _COPULAS  # `the loss is nan`: a sentence, its subject
    if said:
        at = _skip_spaces(text, begin, low)
        begin = _word_before(text, at, low) if at < begin else at
    if begin == at:
        return None
    words = [text[begin:at]]
    if sep != "=" and "_" not in words[0] and "/" not in words[0]:  # `chosen reward`, `lm loss`: up to three words
        words, begin = _more_words(text, begin, low, words)
    while len(words) > 1 and words[0].lower() in _STOP:
        words = words[1:]
    name = " ".join(words)
    if name.lower() in _STOP or name.lower() in _COPULAS or not any(c.isalpha() for c in name):
        return None
    if sep is None and wrapped is None and not said and not _plain_ok(text, begin, low, name):
        return None
    if sep is None and not _ends_field(text, end):  # `number of nan iterations`: a word goes on after it
        return None
    return name


def _ends_field(text: str, end: int) -> bool:
    """The value that ends at `end` ends its field: the line, or a `,`, `|`, `;`, `:` or a closing bracket next."""
    while end < len(text) and text[end] in "'\" ":
        end += 1
    return end >= len(text) or text[end] in ",|;:)]}\r\n"


def _more_words(text: str, begin: int, low: int, words: list[str]) -> tuple[list[str], int]:
    """The words before `words[0]` (at `begin`) that belong to its name: single-space separated, up to three in all,
    stopping at a common word, a copula or a field's start; and where the first starts."""
    while len(words) < 3:
        before = begin - 1
        if before <= low or text[before] != " ":
            break
        first = _word_before(text, before, low)
        word = text[first:before]
        if first == before or word.lower() in _STOP or word.lower() in _COPULAS or not word.isalpha():
            break
        words.insert(0, word)
        begin = first
    return words, begin


def _plain_ok(text: str, begin: int, low: int, name: str) -> bool:
    """A name and its value separated by spaces alone (`loss nan`): read where the name is an identifier, or starts
    a field (the line's start, after a logger's `wandb:` or a `,`/`|`)."""
    if any(char in name for char in "_/."):
        return True
    before = _skip_spaces(text, begin, low)
    return before == 0 or text[before - 1] in _BOUNDARY or text[before - 1] == ":"


def _after_separator(text: str, start: int) -> bool:
    """A `:`, `=`, quote or bracket just before the value at `start` (spaces between)."""
    at = _skip_spaces(text, start, max(0, start - 40))
    return at > 0 and text[at - 1] in ":='\"(["


def loose_pairs(line: str) -> list[tuple[str, str, int]]:
    """(name, value, where) of each NaN/Inf word of `line` that has a name, in order."""
    text = line[:WINDOW]
    out = []
    for count, match in enumerate(_TOKEN.finditer(text)):
        if count >= MAX_TOKENS:
            break
        if not _ends_field(text, match.end()) and not _after_separator(text, match.start()):
            continue  # `number of nan iterations`: a word goes on after it, no `:`/`=`/wrapper before it
        name = _name(text, match.start(), match.end())
        if name is not None:
            out.append((name, match.group(0), match.start()))
    return out
