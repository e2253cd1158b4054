"""The parsers' text: help wrapped to the terminal, and argparse's errors in one line.

    parser = help.Parser(prog="nanscope", ...)          # its subparsers are Parsers too
    sub.add_parser("scan", formatter_class=help.Formatter, description=..., epilog=...)

A description or epilog is written once, at any width; `Formatter` lays it out at the help's width (argparse's:
`COLUMNS`, else the terminal's, else 80): a paragraph of prose is refilled; an indented example line
(`  nanscope scan x.pt   # what it shows`, and comment lines under it that continue its comment) keeps its
command whole where it fits, else breaks it between words with a shell continuation (` \\`), and its comment goes
on the lines below when the two do not fit on one. A definition (`  TERM  what it is`, its further lines indented to
the column its text starts at) is refilled beside its term, or below it, indented, where the term is wide.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap

from nanscope.cli import terminal
from nanscope.inputs import printable

_COMMENT = "  # "  # what separates an example's command from its comment, as laid out


def _split(line: str) -> tuple[str, str, str]:
    """(command, separator, comment) of an example line: its comment starts at the first ` # `."""
    head, sep, tail = line.partition(" # ")
    return head, sep, tail


# `  TERM  what it is` (a word, or an option and its metavar: `--hazard NAME`), not an example's `command  # ...`
_DEFINITION = re.compile(r"(?P<term>\S+(?: [A-Z][A-Z_.|]*)?)(?P<gap> {2,})(?!#)\S")

_MORE = "    "  # the indent of an example's continuation lines, past its own


class Parser(argparse.ArgumentParser):
    """argparse's parser whose error is one line (`nanscope scan: error: argument --workers: ...`), exit 2: the
    usage block it would print first is `--help`'s to show."""

    def error(self, message: str):
        line = f"{self.prog}: error: {printable(message)} (see {self.prog} --help)"
        self.exit(2, terminal.shown_note(line, sys.stderr) + "\n")  # argparse prints it to stderr


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs laid out at the help's width (the module's docstring says how)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(f"{indent}{line}".rstrip() + "\n" for line in layout(text, max(width, 20)))


def layout(text: str, width: int) -> list[str]:
    """`text` (prose paragraphs and indented example lines) as lines of at most `width` columns, where a word allows."""
    lines: list[str] = []
    prose: list[str] = []
    example: list[str] | None = None  # [indent, command, comment] of the example being read
    definition: list = []  # [indent, term, column its text starts at, [text, ...]] of the definition being read

    def flush() -> None:
        nonlocal example
        if prose:
            lines.extend(textwrap.wrap(" ".join(prose), width, break_long_words=False, break_on_hyphens=False))
            prose.clear()
        if example is not None:
            lines.extend(_example(*example, width))
            example = None
        if definition:
            lines.extend(_definition(*definition, width))
            definition.clear()

    for raw in text.strip("\n").splitlines():
        stripped = raw.strip()
        indent = raw[: len(raw) - len(raw.lstrip())]
        term = _DEFINITION.match(stripped) if indent else None
        if not stripped:
            flush()
            lines.append("")
        elif definition and len(indent) == definition[2]:  # the definition's text, continued
            definition[3].append(stripped)
        elif term:
            flush()
            column = len(indent) + term.end("gap")
            definition[:] = [indent, term["term"], column, [stripped[term.end("gap") :]]]
        elif not indent:
            if example is not None:
                flush()
            prose.append(stripped)
        elif stripped.startswith("#") and example is not None:  # the example's comment, continued
            example[2] = f"{example[2]} {stripped.lstrip('#').strip()}".strip()
        else:
            flush()
            command, _, comment = ("", "", stripped[1:]) if stripped.startswith("#") else _split(stripped)
            example = [indent, command.strip(), comment.strip()]
    flush()
    return lines


def _definition(indent: str, term: str, column: int, text: list[str], width: int) -> list[str]:
    """`TERM  text` with the text refilled in the column it started at; where that leaves it under half the width,
    the term alone and the text below it, indented past the term's indent."""
    if column > width // 2:
        lead, column = [indent + term], len(indent) + len(_MORE)
    else:
        lead = []
    first = (indent + term).ljust(column) if not lead else " " * column
    wrapper = textwrap.TextWrapper(
        width, initial_indent=first, subsequent_indent=" " * column, break_long_words=False, break_on_hyphens=False
    )
    return lead + wrapper.wrap(" ".join(text))


def _example(indent: str, command: str, comment: str, width: int) -> list[str]:
    """One example: `command  # comment` on one line where it fits; else the command (broken between words with
    ` \\` where it is too long) and its comment below it."""
    whole = f"{indent}{command}{_COMMENT}{comment}" if comment else f"{indent}{command}"
    if len(whole) <= width or not command:
        return [whole] if command else [f"{indent}# {comment}"]
    out = _command(indent, command, width)
    more = indent + _MORE
    out += [
        f"{more}# {line}" for line in textwrap.wrap(comment, max(width - len(more) - 2, 10), break_long_words=False)
    ]
    return out


def _command(indent: str, command: str, width: int) -> list[str]:
    """A shell command in lines of at most `width` columns, each but the last ending in ` \\` (a word longer than a
    line stays whole)."""
    if len(indent) + len(command) <= width:
        return [indent + command]
    out: list[str] = []
    line = indent
    for word in command.split(" "):
        head = line if line.strip() else line + word
        if line.strip() and len(line) + 1 + len(word) + 2 > width:
            out.append(line + " \\")
            line = indent + _MORE + word
        elif line.strip():
            line = f"{line} {word}"
        else:
            line = head
    return out + [line]
