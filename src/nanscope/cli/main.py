"""The `nanscope` entry point: dispatches to one module per subcommand.

    nanscope repro            # reproduce the case on CPU through real megatron-core, then the fix
    nanscope hazards          # the hazard catalogue through slime v0.1.0's loss
    nanscope doctor --case slime-795
    nanscope scan rollout_data/12.pt
    nanscope trace ...
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nanscope.errors import UserError

# Subcommand name -> module under nanscope.cli. Imported lazily: megatron-core takes seconds to import.
COMMANDS = ("repro", "hazards", "doctor", "scan", "trace")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="nanscope", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        module = importlib.import_module(f"nanscope.cli.{name.replace('-', '_')}")
        module.add_parser(sub)
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


if __name__ == "__main__":
    sys.exit(main())
