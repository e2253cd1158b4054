"""The `nanscope` entry point: dispatches to one module per subcommand, behind one guard.

    nanscope repro            # reproduce the case on CPU through real megatron-core, then the fix
    nanscope hazards          # the hazard catalogue through slime v0.1.0's loss
    nanscope doctor --case slime-795
    nanscope scan rollout_data/12.pt
    nanscope trace ...

Exit codes: 0 clean, 1 what the command looks for was found (scan: hazards; repro: an outcome that
differs from the expected one), 2 bad input or an internal error (one line on stderr; `--debug`
shows the traceback), 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nanscope.errors import UserError

# Subcommand name -> module under nanscope.cli. Imported lazily: megatron-core takes seconds to import.
COMMANDS = ("repro", "hazards", "doctor", "scan", "trace")
# The argument that names a command's input, for the one-line report of an internal error.
INPUTS = ("dump", "script", "file", "case", "hazard")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="nanscope", description=__doc__.splitlines()[0])
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
    try:
        return int(modules[args.command].run(args) or 0)
    except UserError as e:
        print(f"nanscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the backstop: a bug must not read as exit 1 ("found"), nor flood stderr
        if args.debug:
            raise
        print(
            f"nanscope {args.command}: internal error{_input(args)}: {type(e).__name__}: {_first_line(e)} "
            "(rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 2


def _input(args) -> str:
    for name in INPUTS:
        value = getattr(args, name, None)
        if value is not None:
            return f" on {value}" if name in ("dump", "script", "file") else f" on --{name} {value}"
    return ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 300 else line[:300] + "..."


if __name__ == "__main__":
    sys.exit(main())
