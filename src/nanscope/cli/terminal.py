"""Every rich console the commands print through, at one width rule.

    console = terminal.console()                 # stdout
    bar_console = terminal.console(stderr=True)  # progress and notes
    say = terminal.printer()                     # plain lines (trace's), folded at the width

The width: `COLUMNS` when it is a number (as argparse's help and Python's shutil take it), else the terminal's
when the stream is one, else `PIPED_WIDTH` (a file, a pipe, CI's log). Rich wraps every line at that width, long
values at word boundaries; no command prints a line wider, except a single word (a path) that is wider itself.
"""

from __future__ import annotations

import os
import sys

from nanscope.report.text import folded

PIPED_WIDTH = 100  # columns when the output is no terminal and COLUMNS is unset
MIN_WIDTH = 20  # a narrower COLUMNS or terminal is taken as this: a table needs a few columns per column


def width(stream=None, environ=os.environ) -> int:
    """The columns output to `stream` (default stdout) is laid out in."""
    stream = sys.stdout if stream is None else stream
    columns = environ.get("COLUMNS", "").strip()
    if columns.isascii() and columns.isdigit() and len(columns) <= 5:
        return max(int(columns), MIN_WIDTH)
    try:
        if stream.isatty():
            return max(os.get_terminal_size(stream.fileno()).columns, MIN_WIDTH)
    except (AttributeError, OSError, ValueError):  # a closed stream, a test's capture: not a terminal
        pass
    return PIPED_WIDTH


def console(*, stderr: bool = False, **options):
    """A rich Console on stdout (or stderr) at `width()`; `options` are rich's (highlight=False, ...)."""
    from rich.console import Console  # heavy: rich, which `nanscope --help` never needs

    return Console(stderr=stderr, width=width(sys.stderr if stderr else sys.stdout), **options)


def printer(stream=None):
    """A print for plain text lines to `stream` (default stdout): each line of what it is given folded at `width()`."""

    def say(text: str) -> None:
        out = sys.stdout if stream is None else stream
        columns = width(out)
        print(folded(str(text), columns), file=out)

    return say
