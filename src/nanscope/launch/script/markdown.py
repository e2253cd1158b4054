"""A launch command pasted in Markdown (a report's text given as the launch script): its quoted lines, unquoted.

    My run dies with NaN:           (prose: not read)
    ```bash                         (a fence: the lines inside it are the command's)
    $ torchrun --nproc_per_node 8 pretrain_gpt.py \\      (a shell prompt `$ `: dropped)
    ```
    > python train.py --fp16        (a quote `> `, nested `> > ` too: dropped)

A command copied from an interactive shell carries bash's continuation prompt (PS2, `> `) on each line after a `\\`:

    python train.py \\
    >   --lr 1e-5                   (a `> ` after a line ending in `\\`: the prompt dropped, the line kept)

A value the poster left out as `<data_path>` is a placeholder, not bash's redirections (`redacted`).

`unquote` keeps one output line per input line (blank where a line is not the command's), so every line number
nanscope says is the pasted text's. A text with no fence, no quoted line and no prompt is left alone (a script).
"""

from __future__ import annotations

import re

_FENCES = ("```", "~~~")


def unquote(text: str) -> tuple[str, str] | None:
    """(the text with only its quoted command lines, unquoted; what was read, in words); None: no Markdown in it."""
    lines = text.split("\n")
    fenced = any(line.lstrip().startswith(_FENCES) for line in lines)
    ps2 = _continuation_prompts(lines)
    if ps2:  # bash's PS2 prompts, not Markdown quotes: dropped, the rest read as any paste
        lines = [_unquoted(line) if line.startswith(">") else line for line in lines]
    quoted = not _script_file(lines) and any(  # a `\\` then `> log` is a script's redirection, no quote
        line.startswith(">") and not _continues(lines, i) for i, line in enumerate(lines)
    )
    prompted = any(_prompt(line) is not None for line in lines)
    if not (fenced or quoted or prompted):
        return (
            ("\n".join(lines), "read as a command copied from a shell: the `> ` continuation prompts dropped")
            if ps2
            else None
        )
    out, inside, continued = [], False, False
    for line in lines:
        body = _unquoted(line) if quoted else line
        if body.lstrip().startswith(_FENCES):
            inside, kept = not inside, None
        elif fenced:
            kept = body if inside else None
        elif quoted:
            kept = body if line.startswith(">") else None
        else:
            kept = body if (continued or _prompt(body) is not None) else None
        if kept is not None:
            after = _prompt(kept)
            kept = after if after is not None else kept
        continued = kept is not None and kept.rstrip().endswith("\\")
        out.append("" if kept is None else kept)
    what = ", ".join(word for word, used in (("its ``` fences", fenced), ("its `> ` quotes", quoted),
                                             ("its `$ ` prompts", prompted), ("bash's `> ` continuation prompts", ps2))
                     if used)  # fmt: skip
    return "\n".join(out), f"read as a Markdown paste: the command lines inside {what}, the rest not read"


def _unquoted(line: str) -> str:
    """`line` without its `>` quote marks (`> > x`: x)."""
    while line.startswith(">"):
        line = line[1:]
        line = line[1:] if line.startswith(" ") else line
    return line


def _prompt(line: str) -> str | None:
    """The command after a shell prompt at the line's start (`$ `, `# ` is a comment, not read); None: none."""
    stripped = line.lstrip()
    return stripped[2:] if stripped.startswith("$ ") else None


def _continuation_prompts(lines: list[str]) -> bool:
    """Every line that starts with `>` follows a line ending in `\\`, and every line after one starts with `>` (bash's
    PS2 prompt on a continued command, not a Markdown quote, nor a script's `\\` then `> log 2>&1`), and there is
    one."""
    if _script_file(lines):  # its `>` lines are redirections
        return False
    prompted = [i for i, line in enumerate(lines) if line.startswith(">")]
    continued = [i for i in range(1, len(lines)) if _continues(lines, i)]
    return (
        bool(prompted)
        and all(_continues(lines, i) for i in prompted)
        and all(lines[i].startswith(">") for i in continued)  # every continued line prompted: none a redirection
    )


def _continues(lines: list[str], i: int) -> bool:
    """Line `i` continues the command of the line before it (that line ends in `\\`)."""
    return i > 0 and lines[i - 1].rstrip().endswith("\\")


def _script_file(lines: list[str]) -> bool:
    return bool(lines) and lines[0].startswith("#!")


# `<data_path>`: a word in angle brackets after a space or `=`, followed by a space or the line's end (`<in >out`,
# `2>&1`, `<<EOF` do not match: a redirection's `<` is followed by its file, and `>` never closes that file's name);
# `--train_dataset=<>`: an empty one after `=` (bash's `<>` redirection takes a file after it, never an `=` before)
_PLACEHOLDER = re.compile(r"(?<=[ \t=])<([A-Za-z][A-Za-z0-9_./:-]{0,60})>(?=[ \t]|$)|(?<==)<>(?=[ \t]|$)", re.MULTILINE)


def as_pasted(text: str) -> tuple[str, str | None, list[tuple[int, str]]]:
    """A script as a report pasted it: the text to read, what of it was read (`unquote`; None: all of it), and the
    notes on its placeholders, (line, words) each."""
    pasted = unquote(text)
    text, placeholders = redacted(pasted[0] if pasted is not None else text)
    read = None if pasted is None else pasted[1]
    if not placeholders:
        return text, read, []
    distinct = list(dict.fromkeys(word for _, word in placeholders))
    words = ", ".join(f"`{word}`" for word in distinct[:4]) + (", ..." if len(distinct) > 4 else "")
    return text, read, [(placeholders[0][0], f"{words} read as value(s) the poster left out (bash would read their "
                                              "`<` and `>` as redirections)")]  # fmt: skip


def redacted(text: str) -> tuple[str, list[tuple[int, str]]]:
    """`text` with each `<placeholder>` outside quotes and comments single-quoted (read as a word), and (line,
    placeholder) for each: bash would read `--dataset <data_path> \\` as redirections, the `>` taking the next line's
    first word as its file. Inside quotes (`--system '... <think> ...'`) bash keeps it literal: left alone."""
    matches = [m for m in _PLACEHOLDER.finditer(text)] if "<" in text else []
    if not matches:
        return text, []
    outside = _unquoted_starts(text, {m.start() for m in matches})
    kept = [m for m in matches if m.start() in outside]
    out, at = [], 0
    for m in kept:
        out += [text[at : m.start()], f"'{m[0]}'"]
        at = m.end()
    return "".join(out) + text[at:], [(text.count("\n", 0, m.start()) + 1, m[0]) for m in kept]


def _unquoted_starts(text: str, starts: set[int]) -> set[int]:
    """Those of `starts` outside quotes and `#` comments, by one pass of bash's quoting (a backslash escapes the next
    character outside single quotes)."""
    out, quote, i, n = set(), None, 0, len(text)
    while i < n:
        c = text[i]
        if quote is None and i in starts:
            out.add(i)
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote is None and c == "#" and (i == 0 or text[i - 1] in " \t\n;"):
            i = text.find("\n", i)  # a comment runs to the line's end
            i = n if i < 0 else i
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote == c else c
        i += 1
    return out
