"""`nanscope repro`: the case's failure through real megatron-core on CPU, and the fix passing.

A torchrun launch of a tiny Qwen3-MoE at TP2 x PP2 with sequence parallelism (4 processes, gloo).
Each hazard's batch is built against the model (slime's log-prob pass), then slime's
train_one_step runs: 1F1B schedule -> finalize_model_grads -> DDP bucket NaN check ->
RerunStateMachine -> optimizer step. With no arguments: every hazard x {as-is, safe}.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from nanscope import repro
from nanscope.causes import catalogue
from nanscope.errors import UserError
from nanscope.loss import NAMES as LOSS_NAMES
from nanscope.megatron.proctree import Interrupted
from nanscope.report import files

EPILOG = """\
examples:
  nanscope repro                                       # the matrix: every hazard x {as-is, safe}
  nanscope repro --hazard kl-exp-overflow --loss as-is # the case's exact error, from a last-stage rank
  nanscope repro --hazard healthy --json healthy.json
  nanscope repro --hazard kl-exp-overflow --steps 5 --inject-step 3   # as-is dies at 3, safe runs 5
  nanscope repro --hazard kl-exp-overflow --loss as-is --trace --json t.json  # the op and token
  nanscope repro --hazard kl-exp-overflow --steps 4 --inject-step 2 --plugin  # the slime plugin: report, replay
  NANSCOPE_MAX_SKIPS=1 nanscope repro --hazard kl-exp-overflow --steps 2 --inject-step 2 --plugin
  nanscope repro --fault decoder.layers.0.mlp:forward:inf --json f.json   # a fault in any module: the
                                                       # sentinel names module, direction, rank and class
  nanscope repro --fault decoder.layers.2.mlp.router:backward:nan --fault-step 2
  nanscope repro --list-modules                        # the module names --fault takes

exit code: 0 when every observed outcome is the expected one (as-is fails megatron's NaN check
exactly on the hazards, safe completes everywhere), 1 otherwise, 2 for bad input; 130, 143, 129
when SIGINT, SIGTERM or SIGHUP stopped it (the workers are killed and the temp dirs removed first).
"""


def add_parser(sub):
    p = sub.add_parser(
        "repro",
        help="reproduce the case through real megatron-core on CPU, then the fix",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hazard", metavar="NAME", help="one hazard of the catalogue (default: all, as a matrix)")
    p.add_argument("--loss", default="as-is", choices=LOSS_NAMES, help="with --hazard: slime v0.1.0's loss or the fix")
    p.add_argument("--steps", type=int, metavar="N", help="run N optimizer steps with the hazard at --inject-step")
    p.add_argument(
        "--inject-step",
        type=int,
        default=None,
        metavar="K",
        help="with --steps: the step carrying the hazard (default: middle)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="with --hazard: replay the step under the tracer and name the first op that made a non-finite value",
    )
    p.add_argument(
        "--plugin",
        action="store_true",
        help="with --steps: slime with nanscope's plugin installed as documented (hook in raise and in skip "
        "mode, the fix as slime's custom loss), then the replay that the hook's report prints; "
        "NANSCOPE_MAX_SKIPS from the environment applies to the skip run",
    )
    p.add_argument(
        "--fault",
        metavar="MODULE:forward|backward:nan|inf",
        help="plant a fault in one module of the model (the hazard's batch, healthy by default, runs on it); "
        "the module names are --list-modules'",
    )
    p.add_argument(
        "--fault-step",
        type=int,
        metavar="K",
        help="with --fault: the step it fires at (default 1; the steps before it are healthy)",
    )
    p.add_argument("--list-modules", action="store_true", help="print the model's module names, one a line, and exit")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    p.add_argument("--seed", type=int, default=0, help="model and batch seed (default 0)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="hard limit for the launch (default 600)")
    return p


def validate(args) -> None:
    """Every check on the arguments that needs no launch; raises UserError (one line)."""
    if args.hazard is not None and args.hazard not in catalogue.BY_NAME:
        raise UserError(f"--hazard: unknown hazard {args.hazard!r}; known: {', '.join(catalogue.BY_NAME)}")
    if args.fault_step is not None and args.fault is None:
        raise UserError(f"--fault-step {args.fault_step} goes with --fault MODULE:forward|backward:nan|inf")
    if args.fault is not None:
        from nanscope.megatron import faults  # heavy: torch, only a --fault run needs its check

        if args.steps is not None or args.plugin:
            raise UserError("--fault runs one hazard (--hazard, default healthy) up to --fault-step: not with --steps")
        if args.hazard is not None and catalogue.get(args.hazard).fault is not None:
            raise UserError(
                f"--fault: {args.hazard} is a fault in the model already ({catalogue.get(args.hazard).fault})"
            )
        faults.check(faults.parse(args.fault, args.fault_step))
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UserError(f"--timeout {args.timeout:g}: must be a finite number of seconds > 0")
    if args.trace and ((args.hazard is None and args.fault is None) or args.steps is not None):
        raise UserError("--trace goes with --hazard NAME (one step of one hazard)")
    if args.plugin and (args.hazard is None or args.steps is None):
        raise UserError("--plugin goes with --hazard NAME --steps N (the hazard at --inject-step, then its replay)")
    if args.inject_step is not None and args.steps is None:
        raise UserError(f"--inject-step {args.inject_step} goes with --steps N")
    if args.steps is not None:
        if args.steps < 1:
            raise UserError(f"--steps {args.steps}: must be >= 1")
        if args.hazard == catalogue.HEALTHY.name:
            raise UserError("--steps needs a hazard to inject (--hazard NAME, not healthy)")
        if args.hazard is not None and not catalogue.get(args.hazard).safe_finite:
            raise UserError(
                f"--steps shows the safe loss fixing a hazard over several steps; {args.hazard}'s fix "
                f"lives in {catalogue.get(args.hazard).fix}: run it without --steps"
            )
        if args.inject_step is not None and not 1 <= args.inject_step <= args.steps:
            raise UserError(f"--inject-step {args.inject_step} is outside steps 1..{args.steps}")


def _max_skips() -> int | None:
    """NANSCOPE_MAX_SKIPS from the environment, checked as the plugin's hook checks it."""
    from nanscope.slime_plugin.settings import Settings  # heavy: the plugin's package imports torch

    try:
        return Settings.from_env({"NANSCOPE_MAX_SKIPS": os.environ.get("NANSCOPE_MAX_SKIPS", "")}).max_skips
    except ValueError as e:
        raise UserError(str(e)) from None


def run(args) -> int:
    try:
        return _run(args)
    except Interrupted as e:
        print(f"nanscope repro: interrupted; {e.workers} workers stopped", file=sys.stderr)
        return e.exit_code


def _run(args) -> int:
    from rich.console import Console  # heavy: rich, only a launch renders

    from nanscope.report import repro as report  # heavy: rich

    if args.list_modules:
        from nanscope.megatron import faults  # heavy: torch

        print("\n".join(faults.module_names()))
        return 0
    validate(args)
    if args.json:
        files.check_writable(args.json)
    console = Console(width=160)
    if args.steps is not None:
        hazard = args.hazard or catalogue.KL_EXP_OVERFLOW.name
        inject = args.inject_step if args.inject_step is not None else (args.steps + 1) // 2
        result = repro.run_steps(
            hazard,
            steps=args.steps,
            inject_step=inject,
            seed=args.seed,
            timeout_s=args.timeout,
            plugin=args.plugin,
            max_skips=_max_skips() if args.plugin else None,
        )
        report.render_steps(result, console)
        doc = report.steps_to_json(result)
    elif args.hazard is not None or args.fault is not None:
        result = repro.repro_one(
            args.hazard or catalogue.HEALTHY.name,
            args.loss,
            seed=args.seed,
            timeout_s=args.timeout,
            trace=args.trace,
            fault=args.fault,
            fault_step=args.fault_step,
        )
        report.render(result, console)
        doc = report.to_json(result)
    else:
        result = repro.run_matrix(seed=args.seed, timeout_s=args.timeout)
        report.render_matrix(result, console)
        doc = report.matrix_to_json(result)
    if args.json:
        files.write_json(args.json, doc)
    return 0 if result.ok else 1
