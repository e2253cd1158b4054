"""A command cut short by a comment or a blank line inside its `\\` continuation, as bash cuts it.

    python3 -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=grpo \\
        # trainer.logger=['console'] \\
        trainer.n_gpus_per_node=7

bash ends the command at the comment line (a `#` starts a comment, and the comment's own trailing `\\` continues
nothing): `trainer.n_gpus_per_node=7` is a command of its own, not an argument. The reading keeps bash's cut and
says it, with the lines that a reader of the script might take for arguments. A blank line, or one of spaces only
(`\\` then `    ` then a newline: the continuation joins the spaces, and the newline ends the command), cuts it the
same way.
"""

from __future__ import annotations

import re

# after the command's last word: its `\` and newline, one or more comment or blank lines (each through its own
# newline: no two ways to match, linear), then an indented line
_CUT = re.compile(rb"[ \t]*\\\r?\n((?:[ \t]*(?:#[^\n]*)?\n)+)[ \t]+(\S[^\n]{0,80})")
_AT_END = re.compile(rb"[ \t]*\\[ \t\r\n]*\Z")  # a `\` continuation, then nothing: a paste cut mid-command


def cut_note(source: bytes, end_byte: int, end_line: int) -> str | None:
    """The note for a command ending at `end_byte` (its last line `end_line`) cut by a comment or a blank line; None:
    not cut."""
    if _AT_END.match(source, end_byte):
        return (f"line {end_line}: the text ends inside the command's `\\` continuation: the paste is cut there, and "
                "what followed it is not read")  # fmt: skip
    match = _CUT.match(source, end_byte)
    if match is None:
        return None
    comments = match[1].count(b"\n")
    after = end_line + comments + 1
    shown = match[2].decode("utf-8", "replace").rstrip(" \\")
    first = match[1].split(b"\n", 1)[0].rstrip(b"\r")  # the line that ends the command
    what = "a `#` comment line" if first.strip() else "a line of spaces only" if first else "a blank line"
    return (
        f"line {end_line + 1}: {what} inside the command's `\\` continuation ends the command there, as "
        f"bash does: line {after} on (`{shown}` ...) is not its arguments, and what those lines set is not read"
    )
