"""`nanscope doctor`: where and why a Megatron-based run hit NaN, read from its launch script, its traceback or
log, or both.

Either part alone is read: a traceback or log alone (a file, or - for standard input) gives the failing rank, the
check, the schedule and the framework its frames show; a launch script alone gives the layout and the flags'
causes; each says what the other would add. The launch script is parsed (tree-sitter-bash), never executed. The flags are resolved with the slime
release's and Megatron's defaults (--slime-version; else the release the script names, e.g. a path
slime-0.2.4 or slimerl/slime:v0.3.1, or the one its flags imply; else v0.1.0, said in the output), the
rank layout is megatron-core's RankGenerator's (by nanscope's own arithmetic: no megatron import), and a
catalogue of rules maps the flags to NaN mechanisms.
"""

from __future__ import annotations

import contextlib
import warnings
from importlib.resources import as_file

from nanscope import case
from nanscope.cli import help, numbers, terminal
from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.inputs import read_json
from nanscope.launch import Diagnosis, diagnose
from nanscope.launch.logs import STDIN
from nanscope.launch.script import parse_env
from nanscope.launch.script.bounds import OPTION
from nanscope.launch.tracebacks import read_traceback
from nanscope.report import files
from nanscope.report.doctor.document import to_dict
from nanscope.report.doctor.page import render_html
from nanscope.report.doctor.shown import shown

EPILOG = """examples:
  nanscope doctor --case slime-795
  nanscope doctor --case harness --traceback tb.txt  # a `repro --launcher ray --traceback-out tb.txt`, in its world
  nanscope doctor --traceback job.log                # the log alone, of any size
  pbpaste | nanscope doctor --traceback -            # a pasted traceback, or only its error line
  nanscope doctor launch.sh --traceback traceback.txt   # unset variables are inferred, and said so
  nanscope doctor launch.sh --env TOTAL_NODES=8 --model model.json --traceback traceback.txt
  nanscope doctor launch.sh --model-args scripts/models/qwen3-4B.sh --rank 5 --json out.json --html out.html
  nanscope doctor launch.sh --slime-version v0.2.4   # that release's defaults (kl-loss-type k1, ...)
"""


def add_parser(sub):
    parser = sub.add_parser(
        "doctor",
        help="explain a NaN crash from the launch script and traceback",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=help.Formatter,
    )
    parser.add_argument(
        "script", nargs="?", help="slime launch script (bash); read, never executed (optional with --traceback)"
    )
    parser.add_argument(
        "--case",
        metavar="NAME",
        help=f"use a bundled launch instead of a script: {case.NAME} (the case: its launch.sh, model.json and "
        f"traceback.txt) or {case.HARNESS} (the world `nanscope repro` runs, TP2 PP2 on 1 node x 4: its launch.sh, "
        "for a repro's --traceback)",
    )
    parser.add_argument(
        "--env",
        action="append",
        metavar="K=V",
        default=[],
        help="a variable the script reads from its environment (repeatable)",
    )
    parser.add_argument(
        "--model",
        metavar="JSON",
        help="architecture JSON standing in for a missing model-args file: "
        "Megatron names (num_layers, num_experts) or a HF config.json",
    )
    parser.add_argument("--model-args", metavar="FILE", help="model-args file to read where the script sources one")
    parser.add_argument(
        "--traceback",
        metavar="FILE",
        help="the crash's traceback (Ray-wrapped or not), its error line alone, or the whole job log, of any size "
        "(read as a stream for its first Megatron error, the traceback that ends there and the rerun verdict; colour "
        "codes and log prefixes are removed); - reads standard input",
    )
    parser.add_argument(
        "--rank", type=numbers.RANK, help="explain this global rank, 0..2^31-1 (overrides the traceback's)"
    )
    parser.add_argument(
        "--slime-version",
        metavar="RELEASE",
        help=f"the slime release whose defaults, flags and rules apply: {', '.join(releases.KEYS)} "
        "(0.2.4 and V0.2.4 work too; default: the release the script names or its flags imply, else "
        f"{releases.DEFAULT.key}, said in the output)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the diagnosis as JSON")
    parser.add_argument("--html", metavar="PATH", help="write a self-contained HTML page")
    parser.add_argument(
        "--max-input-mb",
        type=numbers.MEBIBYTES,
        default="4",
        metavar="MB",
        help="largest script, sourced file or model file read (default 4; a --traceback log may be any size)",
    )
    return parser


def _load_model(path: str, limit: int) -> dict:
    model = read_json(path, "model JSON", limit, OPTION)
    if not isinstance(model, dict):
        raise UserError(f"{path}: expected a JSON object of architecture fields")
    return model


def _inputs(args, stack) -> tuple[str, dict, str | None, str | None]:
    """(script, env, model JSON path, traceback path), with --case's bundled files as defaults."""
    if args.case and args.script:
        raise UserError("give a launch script or --case, not both")
    if not args.case and not args.script and not args.traceback:
        raise UserError(
            "give a launch script, a --traceback FILE (- for standard input), or both (or --case slime-795)"
        )
    env = parse_env(args.env)
    if not args.case:
        return args.script, env, args.model, args.traceback
    if args.case not in case.BUNDLED:
        raise UserError(f"--case {args.case}: unknown case (bundled: {', '.join(case.BUNDLED)})")
    launch = case.BUNDLED[args.case]
    # as_file per file: works for a zipped install too (directories need Python 3.12)
    bundled = {name: str(stack.enter_context(as_file(case.root(launch.name) / name))) for name in launch.files}
    env = {**launch.env, **env}
    return (
        bundled["launch.sh"],
        env,
        args.model or bundled.get("model.json"),
        args.traceback or bundled.get("traceback.txt"),
    )


def run(args) -> int:
    if args.slime_version is not None:
        releases.get(args.slime_version)  # an unknown release is refused before anything is read
    limit = args.max_input_mb
    with contextlib.ExitStack() as stack:
        script, env, model_path, tb_path = _inputs(args, stack)
        read = [
            ("launch script", script),
            ("model JSON", model_path),
            ("model-args file", args.model_args),
            ("traceback", None if tb_path == STDIN else tb_path),
        ]
        files.check_outputs(_outputs(args), read)
        model = _load_model(model_path, limit) if model_path else None
        model_origin = None
        if model_path:
            model_origin = f"model.json (bundled with {args.case})" if args.case and not args.model else model_path
        traceback = read_traceback(tb_path) if tb_path else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a reader's warning is no part of the report
            diagnosis = diagnose(
                script,
                env=env,
                model=model,
                model_origin=model_origin,
                model_args=args.model_args,
                traceback=traceback,
                traceback_origin="standard input" if tb_path == STDIN else tb_path or "traceback",
                rank=args.rank,
                limit=limit,
                slime_version=args.slime_version,
                case_release=case.BUNDLED[args.case].release if args.case else None,
            )
        # again, with the files the script sourced: the outputs must not replace one of them either
        sources = diagnosis.script.sources if diagnosis.script is not None else []
        files.check_outputs(_outputs(args), read + [("sourced file", s.followed) for s in sources])
    _report(diagnosis, args)
    return 0


def _outputs(args) -> dict:
    return {"--json": args.json, "--html": args.html}


def _report(diagnosis: Diagnosis, args) -> None:
    from nanscope.report.doctor.terminal import render_terminal  # heavy: rich at its top

    if args.json:  # files first: a closed stdout pipe (| head) must not lose them
        files.write_json(args.json, to_dict(diagnosis))  # as read: json.dumps escapes every control character
    display = shown(diagnosis)  # no control character of a file reaches the page or the terminal
    if args.html:
        files.write_text(args.html, render_html(display))
    render_terminal(display, terminal.console(highlight=False))
