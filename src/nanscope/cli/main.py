"""The `nanscope` entry point: dispatches to one module per subcommand, behind one guard.

    nanscope repro            # reproduce the case on CPU through real megatron-core, then the fix
    nanscope hazards          # the hazard catalogue through slime v0.1.0's loss
    nanscope doctor --case slime-795
    nanscope scan rollout_data/12.pt
    nanscope trace ...

Exit codes: 0 clean, 1 what the command looks for was found (scan: hazards; repro: an outcome that
differs from the expected one), 2 bad input or an internal error (one line on stderr, folded at the width where
stderr is a terminal; `--debug` shows the traceback), 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP. An
error's line escapes what is not printable (a newline in a file name) as repr() does; warnings that torch or numpy
raise come after a command that finished, one line each, and never beside an error's line (--debug shows them as
Python does).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import warnings

from nanscope import __version__
from nanscope.cli import help, terminal
from nanscope.errors import UserError
from nanscope.inputs import printable

# Subcommand name -> module under nanscope.cli. Imported lazily: megatron-core takes seconds to import.
COMMANDS = ("repro", "hazards", "doctor", "scan", "trace")
# The argument that names a command's input, for the one-line report of an internal error.
INPUTS = ("dump", "script", "file", "case", "hazard")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = help.Parser(prog="nanscope", description=__doc__.splitlines()[0], formatter_class=help.Formatter)
    parser.add_argument("--version", action="version", version=f"nanscope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an internal error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        module = importlib.import_module(f"nanscope.cli.{name}")
        p = module.add_parser(sub)
        # also after the command, where a user retrying a failed command types it
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    caught = _Warnings()
    with warnings.catch_warnings():
        if not args.debug:  # --debug: every warning as Python prints it, as it comes
            warnings.showwarning = caught.add  # restored when the block ends
        stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
        try:
            code = _guarded(modules[args.command], args)
            if code in (0, 1):
                code = _finish(args, code)
        finally:
            sys.stdout = stdout
    if code in (0, 1):  # after an error its line stays the only one on stderr
        caught.print(args.command)
    return code


# 128 + SIGPIPE, as a command killed by the signal exits: `nanscope hazards | head` ends quietly
PIPE_CLOSED = 141


def _finish(args, code: int) -> int:
    """The command's code once stdout is flushed, and one line on stderr naming the files --json / --html wrote."""
    try:
        sys.stdout.flush()
    except StdoutError as e:
        return _stdout_error(args, e)
    written = [f"{getattr(args, flag)} (--{flag})" for flag in ("json", "html") if getattr(args, flag, None)]
    if written:
        terminal.note(f"nanscope {args.command}: wrote {', '.join(one_line(w) for w in written)}")
    return code


def _stdout_error(args, e: StdoutError) -> int:
    """Exit quietly when stdout's reader went away (`| head` has what it wanted); else one line, exit 2."""
    _drop_stdout()
    if e.errno == errno.EPIPE:
        return PIPE_CLOSED
    terminal.note(f"nanscope {args.command}: error: cannot write standard output: {e.strerror or e}")
    return 2


class StdoutError(OSError):
    """Writing standard output failed (its reader went away, a full disk): the output's fault, not a bug."""


class _Stdout:
    """sys.stdout, whose write and flush raise StdoutError: told apart from a failing output file."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _drop_stdout() -> None:
    """Standard output pointed at /dev/null: the interpreter's own flush at exit must not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a test's capture: nothing to redirect
        pass
    finally:
        os.close(devnull)


def _guarded(module, args) -> int:
    """The command's exit code: its own, or 2 with one line on stderr for bad input or a bug."""
    try:
        return int(module.run(args) or 0)
    except UserError as e:
        terminal.note(f"nanscope {args.command}: error: {one_line(str(e))}")
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of stderr went away
        _drop_stdout()
        return PIPE_CLOSED
    except StdoutError as e:
        return _stdout_error(args, e)
    except Exception as e:  # the backstop: a bug must not read as exit 1 ("found"), nor flood stderr
        if args.debug:
            raise
        terminal.note(
            f"nanscope {args.command}: internal error{_input(args)}: {type(e).__name__}: {_first_line(e)} "
            "(rerun with --debug for the traceback)"
        )
        return 2


class _Warnings:
    """The warnings a command raised (torch's, numpy's), kept to be printed one line each after it finished:
    printed as they came, their two lines each would split a command's one-line error."""

    KEPT = 10  # a warning raised per sample must not fill memory or the terminal

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.dropped = 0

    def add(self, message, category, filename, lineno, file=None, line=None) -> None:
        if len(self.lines) < self.KEPT:
            self.lines.append(f"{category.__name__}: {_first_line(message)}")
        else:
            self.dropped += 1

    def print(self, command: str) -> None:
        more = [f"{self.dropped} more warnings not shown"] if self.dropped else []
        for line in self.lines + more:
            terminal.note(f"nanscope {command}: warning: {line}")


def one_line(text: str) -> str:
    """`text` with each unprintable character (a newline in a file name, an ANSI escape) as repr() writes it."""
    return printable(text)


def _input(args) -> str:
    for name in INPUTS:
        value = getattr(args, name, None)
        if value is not None:
            return f" on {one_line(value)}" if name in ("dump", "script", "file") else f" on --{name} {one_line(value)}"
    return ""


def _first_line(e) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return one_line(line if len(line) <= 300 else line[:300] + "...")


if __name__ == "__main__":
    sys.exit(main())
