"""`nanscope repro --slime-src DIR`: slime's own train.py on CPU (its own Ray actors, its own train step, Megatron-LM's
megatron.training), the case's hazard in its rollout; as-is it dies with the case's error and frames, with --plugin
it is caught, reported, replayed and trained through. `repro.py` hands this mode's arguments here.

examples:
  nanscope repro --slime-src ~/slime --megatron-lm-src ~/Megatron-LM --traceback-out tb.txt
                                                       # the case's traceback from slime's own code; then:
  nanscope doctor --case slime-795 --traceback tb.txt
  nanscope repro --slime-src ~/slime --megatron-lm-src ~/Megatron-LM --plugin --report-dir reports
                                                       # with the README's plugin lines; then:
  nanscope trace reports --slime-src ~/slime
"""

from __future__ import annotations

from nanscope import slime_repro
from nanscope.cli import progress
from nanscope.errors import UserError
from nanscope.facts.paths import REPORT_DIR
from nanscope.megatron import ray_session
from nanscope.report import files
from nanscope.slime_train import run as slime_run
from nanscope.slime_train.prepare import IN_DATA

TIMEOUT_S = 1800.0  # --timeout's default here: one train.py launch takes minutes on 2 cores, --plugin two
# repro's flags that belong to its own harness, not to a run of slime's train.py
HARNESS_ONLY = ("all", "steps", "inject_step", "trace", "fault", "fault_step", "fault_once", "list_modules",
                "launcher", "ray_address", "natural", "lr")  # fmt: skip


def add_arguments(p) -> None:
    """This mode's two flags on `nanscope repro`'s parser (or an argument group of it)."""
    p.add_argument(
        "--slime-src",
        metavar="DIR",
        help="run slime's own train.py from this checkout (train.py and slime/) on CPU instead of the harness (Ray, 4 "
        "logical GPUs, the hazard in its rollout; --hazard: the ones a rollout carries): as-is it dies with the case's "
        "error and frames; with --plugin it is caught, reported and trained through (nanscope[ray,slime]; "
        "docs/slime-train.md)",
    )
    p.add_argument(
        "--megatron-lm-src",
        metavar="DIR",
        help="with --slime-src: a Megatron-LM checkout (megatron/training, at core_v0.15.0rc0 for the case's line numbers); "
        "default: megatron.training as importable here",
    )


def validate(args) -> slime_run.Sources:
    """Every check on this mode's arguments; returns the checkouts. Raises UserError (one line)."""
    given = [f"--{name.replace('_', '-')}" for name in HARNESS_ONLY if getattr(args, name) not in (None, False)]
    if given:
        raise UserError(f"--slime-src runs slime's own train.py: not with {', '.join(given)} (the harness's flags)")
    hazard = args.hazard or slime_repro.DEFAULT_HAZARD
    if hazard not in IN_DATA:
        raise UserError(
            f"--slime-src plants the hazard in the rollout only; {hazard} does not live there (choose one of "
            f"{', '.join(IN_DATA)}; the harness runs every hazard: drop --slime-src)"
        )
    if args.loss != "as-is":
        raise UserError(f"--slime-src --loss {args.loss}: the fix runs as the plugin does, through --plugin")
    if args.plugin and args.traceback_out:
        raise UserError("--traceback-out goes with the as-is run (without --plugin): the plugin run trains through")
    if args.report_dir is not None and not args.plugin:
        raise UserError(f"--report-dir {args.report_dir} goes with --plugin (the plugin's reports and bundles)")
    if args.plugin:  # checked now, not after the run's minutes: the drivers' logs are copied there at its end
        files.check_directory(args.report_dir or REPORT_DIR, "--report-dir")
    ray_session.require("--slime-src")
    return slime_run.check_sources(args.slime_src, args.megatron_lm_src)


def run(args, sources: slime_run.Sources, console) -> tuple[int, dict]:
    """The run and its rendering; (exit code, the JSON document)."""
    from nanscope.report import slime_repro as report  # heavy: rich

    with progress.Lines("repro", quiet=args.quiet) as lines:
        rep = _run(args, sources, lines)
    report.render(rep, console)
    return (0 if rep.ok else 1), report.to_json(rep)


def _run(args, sources: slime_run.Sources, lines):
    return slime_repro.run(
        sources,
        hazard=args.hazard or slime_repro.DEFAULT_HAZARD,
        plugin=args.plugin,
        report_dir=(args.report_dir or REPORT_DIR) if args.plugin else None,
        seed=args.seed,
        timeout_s=args.timeout if args.timeout is not None else TIMEOUT_S,
        progress=lines,
    )
