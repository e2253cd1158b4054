"""Every rich console the commands print through, at one width rule.

    console = terminal.console()                 # stdout
    bar_console = terminal.console(stderr=True)  # progress and notes
    say = terminal.printer()                     # plain lines (trace's), folded at the width
    terminal.note("nanscope scan: error: ...")   # a one-line message on stderr: folded on a terminal only

The width: `COLUMNS` when it is a number (as argparse's help and Python's shutil take it), else the terminal's
when the stream is one, else `PIPED_WIDTH` (a file, a pipe, CI's log). Rich wraps every line at that width, long
values at word boundaries; no command prints a line wider, except a single word (a path) that is wider itself.
A one-line message on stderr (an error, `wrote PATH`) is folded at that width only where stderr is a terminal: piped,
it stays the one line that scripts and tests grep.
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


def note(text: str, stream=None) -> None:
    """Print the one-line message `text` to `stream` (default stderr): on a terminal folded at `width()`, its further
    lines indented; elsewhere (a pipe, a file) whole, one line."""
    out = sys.stderr if stream is None else stream
    print(shown_note(text, out), file=out)


def shown_note(text: str, stream) -> str:
    """`text` as `note` prints it to `stream`."""
    return folded(text, width(stream), cut_words=True) if _is_terminal(stream) else text


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # a closed stream, a test's capture: not a terminal
        return False
