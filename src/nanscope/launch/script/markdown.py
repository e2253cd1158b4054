"""A launch command pasted in Markdown (a report's text given as the launch script): its quoted lines, unquoted.

    My run dies with NaN:           (prose: not read)
    ```bash                         (a fence: the lines inside it are the command's)
    $ torchrun --nproc_per_node 8 pretrain_gpt.py \\      (a shell prompt `$ `: dropped)
    ```
    > python train.py --fp16        (a quote `> `, nested `> > ` too: dropped)

`unquote` keeps one output line per input line (blank where a line is not the command's), so every line number
nanscope says is the pasted text's. A text with no fence, no quoted line and no prompt is left alone (a script).
"""

from __future__ import annotations

_FENCES = ("```", "~~~")


def unquote(text: str) -> tuple[str, str] | None:
    """(the text with only its quoted command lines, unquoted; what was read, in words); None: no Markdown in it."""
    lines = text.split("\n")
    fenced = any(line.lstrip().startswith(_FENCES) for line in lines)
    quoted = any(line.startswith(">") for line in lines)
    prompted = any(_prompt(line) is not None for line in lines)
    if not (fenced or quoted or prompted):
        return None
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
                                             ("its `$ ` prompts", prompted)) if used)  # fmt: skip
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
