"""`nanscope repro`: the case's failure through real megatron-core on CPU, and the fix passing.

A torchrun launch of a tiny Qwen3-MoE at TP2 x PP2 with sequence parallelism (4 processes, gloo).
Each hazard's batch is built against the model (slime's log-prob pass), then slime's
train_one_step runs: 1F1B schedule -> finalize_model_grads -> DDP bucket NaN check ->
RerunStateMachine -> optimizer step. With no arguments: the healthy batch and the case's four hazards x
{as-is, safe} (`--all`: every hazard of the catalogue). With `--launcher ray` the ranks are a train group of Ray actors instead, as in slime, and a failure reaches
the driver wrapped in a RayTaskError, as in the case's traceback.
"""

from __future__ import annotations

import os
import shlex

from nanscope import case, natural, repro
from nanscope.causes import catalogue
from nanscope.cli import help, numbers, progress, repro_slime, terminal
from nanscope.errors import UserError
from nanscope.facts.paths import REPORT_DIR, REPORT_FILE
from nanscope.loss import NAMES as LOSS_NAMES
from nanscope.megatron import ray_session
from nanscope.megatron.proctree import Interrupted
from nanscope.megatron.spec import Launcher
from nanscope.report import files

TIMEOUT_HELP = (
    f"hard limit for the launch (default 600; {natural.TIMEOUT_S:.0f} with --natural: two runs of --steps; "
    f"{repro_slime.TIMEOUT_S:.0f} with --slime-src)"
)
MAX_STEPS = numbers.STEPS  # --steps and --fault-step: every step is a full optimizer step of the harness

EPILOG = """\
examples:
  nanscope repro                                       # the matrix: healthy and the case's 4 hazards x
                                                       # {as-is, safe}
  nanscope repro --all                                 # the matrix over the whole catalogue (14 hazards)
  nanscope repro --hazard kl-exp-overflow --loss as-is # the case's exact error, from a last-stage rank
  nanscope repro --hazard healthy --json healthy.json
  nanscope repro --hazard kl-exp-overflow --steps 5 --inject-step 3   # as-is dies at 3, safe runs 5
  nanscope repro --hazard kl-exp-overflow --loss as-is --trace --json t.json  # the op and token
  nanscope repro --hazard kl-exp-overflow --steps 4 --inject-step 2 --plugin  # the slime plugin: report, bundle,
                                                       # replayed offline; then: nanscope trace nanscope_reports
  NANSCOPE_MAX_SKIPS=1 nanscope repro --hazard kl-exp-overflow --steps 2 --inject-step 2 --plugin
  nanscope repro --fault decoder.layers.0.mlp:forward:inf --json f.json   # a fault in any module: the
                                                       # sentinel names module, direction, rank and class
  nanscope repro --fault decoder.layers.2.mlp.router:backward:nan --fault-step 2
  nanscope repro --fault decoder.layers.1.mlp:forward:inf --fault-once   # a transient fault (the hardware cause):
                                                       # the plugin's hook reruns the step, its verdict printed
  nanscope repro --list-modules                        # the module names --fault takes
  nanscope repro --launcher ray                        # the same matrix, the ranks as Ray actors (nanscope[ray])
  nanscope repro --launcher ray --hazard kl-exp-overflow --traceback-out tb.txt   # the case's Ray-wrapped
                                                       # traceback; then, in the harness's world (its launch.sh
                                                       # ships): nanscope doctor --case harness --traceback tb.txt
  nanscope repro --natural --seed 0 --json n.json      # nothing planted: a GRPO loop whose training drives the
                                                       # KL's exp past fp32 on a masked tool token; as-is dies,
                                                       # the plugin trains through and warns first
  nanscope repro --natural --seed 3 --steps 40 --lr 2e-3
  nanscope repro --slime-src ~/slime --megatron-lm-src ~/Megatron-LM --traceback-out tb.txt   # slime's own train.py
                                                       # on CPU: the case's traceback from slime's own frames
  nanscope repro --slime-src ~/slime --megatron-lm-src ~/Megatron-LM --plugin --report-dir reports  # with the plugin

exit code: 0 when every run's observed outcome is its expected one: as-is fails megatron's NaN check on
every hazard and completes on healthy batches; safe completes where its loss is the fix and fails the check,
by design, where the fix lives elsewhere (a flag, the model, a kernel, the device: `nanscope hazards` lists
which); with --steps, as-is dies at the hazard's step and safe runs every step; with --natural, as-is dies
where an exp first crossed 88.72 and the plugin run is finite at every step, warned 2 steps ahead. 1 when an
outcome differs from its expected one, 2 for bad input; 130, 143, 129 when SIGINT, SIGTERM or SIGHUP stopped it
(the workers are killed and the temp dirs removed first).
"""


def add_parser(sub):
    p = sub.add_parser(
        "repro",
        help="reproduce the case through real megatron-core on CPU, then the fix",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=help.Formatter,
    )
    _what(p.add_argument_group("what runs"))
    _plugin(p.add_argument_group("the slime plugin"))
    _fault(p.add_argument_group("a fault in the model"))
    _add_natural(p.add_argument_group("nothing planted: the natural loop"))
    repro_slime.add_arguments(p.add_argument_group("slime's own train.py"))
    _launch(p.add_argument_group("the launch and its outputs"))
    return p


def _what(g) -> None:
    g.add_argument(
        "--hazard", metavar="NAME", help="one hazard of the catalogue (default: a matrix of the case's hazards)"
    )
    g.add_argument(
        "--all", action="store_true", help="the matrix over the whole catalogue (default: healthy and the case's 4)"
    )
    g.add_argument("--loss", default="as-is", choices=LOSS_NAMES, help="with --hazard: slime v0.1.0's loss or the fix")
    g.add_argument(
        "--steps",
        type=numbers.STEP,
        metavar="N",
        help=f"run N optimizer steps with the hazard at --inject-step (1..{MAX_STEPS})",
    )
    g.add_argument(
        "--inject-step",
        type=numbers.STEP,
        default=None,
        metavar="K",
        help="with --steps: the step carrying the hazard (default: middle)",
    )
    g.add_argument(
        "--trace",
        action="store_true",
        help="with --hazard: replay the step under the tracer and name the first op that made a non-finite value",
    )
    g.add_argument("--seed", type=numbers.SEED, default=0, help="model and batch seed, 0..2^32-1 (default 0)")


def _plugin(g) -> None:
    g.add_argument(
        "--plugin",
        action="store_true",
        help="with --steps: slime with nanscope's plugin installed as documented (hook in raise and in skip "
        "mode, the fix as slime's custom loss); the raise run's reports and repro bundles are left in "
        "--report-dir and replayed offline, as `nanscope trace` does; NANSCOPE_MAX_SKIPS from the environment "
        "applies to the skip run",
    )
    g.add_argument(
        "--report-dir",
        metavar="DIR",
        help=f"with --plugin: where the raise run's reports and bundles are left (default {REPORT_DIR}; "
        "files of the same name are replaced)",
    )


def _fault(g) -> None:
    g.add_argument(
        "--fault",
        metavar="MODULE:forward|backward:nan|inf",
        help="plant a fault in one module of the model (the hazard's batch, healthy by default, runs on it); "
        "the module names are --list-modules'",
    )
    g.add_argument(
        "--fault-step",
        type=numbers.STEP,
        metavar="K",
        help=f"with --fault: the step it fires at, 1..{MAX_STEPS} (default 1; the steps before it are healthy)",
    )
    g.add_argument(
        "--fault-once",
        action="store_true",
        help="with --fault: fire on the module's first call of that step only (a transient fault); the plugin's hook "
        "runs as installed and reruns the step: its verdict (not reproducible) is printed",
    )
    g.add_argument("--list-modules", action="store_true", help="print the model's module names, one a line, and exit")


def _launch(g) -> None:
    g.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    g.add_argument(
        "--launcher",
        choices=("torchrun", "ray"),
        default=None,
        help="how the 4 ranks start: torchrun (default), or ray: a train group of Ray actors, one per rank, as "
        "slime's; a failure then reaches the driver as the case's did, a RayTaskError around the rank's error "
        "(printed; --traceback-out); needs the nanscope[ray] extra",
    )
    g.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="with --launcher ray: join this Ray cluster (default: a local instance, removed after the run)",
    )
    g.add_argument(
        "--ray-timeout",
        type=numbers.SECONDS,
        metavar="S",
        help=f"with --ray-address: give up joining the cluster after S seconds, one line, exit 2 (default "
        f"{ray_session.TIMEOUT_S:g})",
    )
    g.add_argument(
        "--traceback-out",
        metavar="FILE",
        help="with --launcher ray: write the driver's traceback of the (first) as-is failure to FILE, for "
        "`nanscope doctor --case harness --traceback FILE` (the harness's own launch script; the line printed "
        "after the traceback says where it is)",
    )
    g.add_argument("--timeout", type=numbers.SECONDS, metavar="S", help=TIMEOUT_HELP)
    g.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (default: one line a run, and with --natural a step, under a progress display "
        "on a terminal)",
    )


def _add_natural(g) -> None:
    """--natural and the flag only it takes (--seed and --steps are shared)."""
    g.add_argument(
        "--natural",
        action="store_true",
        help="nothing planted: a GRPO loop (rollouts sampled from the current policy at the case's temperature, a toy "
        "tool's output masked, a rule reward, groups of 8, the case's loss flags) as-is and with the plugin, for "
        f"--steps (default {natural.DEFAULT_STEPS}) at --lr; every difference from the case is printed",
    )
    g.add_argument(
        "--lr",
        type=numbers.LEARNING_RATE,
        metavar="LR",
        help=f"with --natural: Adam's learning rate (default {natural.DEFAULT_LR:g}, {natural.DEFAULT_LR / 1e-6:.0f}x "
        "the case's 1e-6: its thousands of rollouts in tens of steps)",
    )


def validate(args) -> None:
    """Every check on the arguments that needs no launch; raises UserError (one line)."""
    if args.slime_src is not None:
        args.sources = repro_slime.validate(args)
        return
    if args.megatron_lm_src is not None:
        raise UserError(f"--megatron-lm-src {args.megatron_lm_src} goes with --slime-src DIR")
    _check_natural(args)
    if args.hazard is not None and args.hazard not in catalogue.BY_NAME:
        raise UserError(f"--hazard: unknown hazard {args.hazard!r}; known: {', '.join(catalogue.BY_NAME)}")
    if args.fault_step is not None and args.fault is None:
        raise UserError(f"--fault-step {args.fault_step} goes with --fault MODULE:forward|backward:nan|inf")
    if args.fault_once and args.fault is None:
        raise UserError("--fault-once goes with --fault MODULE:forward|backward:nan|inf")
    if args.fault is not None:
        from nanscope.megatron import faults  # heavy: torch, only a --fault run needs its check

        if args.steps is not None or args.plugin:
            raise UserError("--fault runs one hazard (--hazard, default healthy) up to --fault-step: not with --steps")
        if args.hazard is not None and catalogue.get(args.hazard).fault is not None:
            raise UserError(
                f"--fault: {args.hazard} is a fault in the model already ({catalogue.get(args.hazard).fault})"
            )
        faults.check(faults.parse(args.fault, args.fault_step))
    if args.all and (args.hazard is not None or args.fault is not None or args.steps is not None):
        raise UserError("--all is the matrix over the whole catalogue: not with --hazard, --fault or --steps")
    if args.list_modules:
        launch = [f"--{name.replace('_', '-')}" for name in _LAUNCH_FLAGS if getattr(args, name) not in (None, False)]
        if launch:
            raise UserError(f"--list-modules lists the model's modules and exits: not with {', '.join(launch)}")
    _check_launcher(args)
    if args.timeout is None:
        args.timeout = natural.TIMEOUT_S if args.natural else 600.0
    if args.trace and ((args.hazard is None and args.fault is None) or args.steps is not None):
        raise UserError("--trace goes with --hazard NAME (one step of one hazard)")
    if args.plugin and (args.hazard is None or args.steps is None):
        raise UserError("--plugin goes with --hazard NAME --steps N (the hazard at --inject-step, then its replay)")
    if args.report_dir is not None and not args.plugin:
        raise UserError(f"--report-dir {args.report_dir} goes with --plugin (the plugin's reports and bundles)")
    if args.plugin:
        _check_report_dir(args)
    if args.inject_step is not None and args.steps is None:
        raise UserError(f"--inject-step {args.inject_step} goes with --steps N")
    if args.steps is not None:
        if args.hazard == catalogue.HEALTHY.name:
            raise UserError("--steps needs a hazard to inject (--hazard NAME, not healthy)")
        if args.hazard is not None and not catalogue.get(args.hazard).safe_finite:
            raise UserError(
                f"--steps shows the safe loss fixing a hazard over several steps; {args.hazard}'s fix "
                f"lives in {catalogue.get(args.hazard).fix}: run it without --steps"
            )
        if args.inject_step is not None and not 1 <= args.inject_step <= args.steps:
            raise UserError(f"--inject-step {args.inject_step} is outside steps 1..{args.steps}")


def _check_natural(args) -> None:
    if not args.natural:
        if args.lr is not None:
            raise UserError(f"--lr {args.lr:g} goes with --natural")
        return
    given = [f"--{name.replace('_', '-')}" for name in _NOT_NATURAL if getattr(args, name) not in (None, False)]
    if given or args.loss != "as-is":
        raise UserError(
            f"--natural runs its own loop (as-is and the plugin): not with {', '.join(given or ['--loss'])}"
        )


# The flags of the other shapes of evidence, which --natural does not take.
_NOT_NATURAL = ("all", "hazard", "inject_step", "trace", "plugin", "report_dir", "fault", "fault_step", "fault_once",
                "list_modules")  # fmt: skip


def _check_report_dir(args) -> None:
    """--plugin's report directory (given, or the default): a directory the run can write, and no output of the
    command takes one of the plugin's names in it."""
    report_dir = args.report_dir or REPORT_DIR
    for flag in ("json", "traceback_out"):
        out = getattr(args, flag)
        same_dir = out and os.path.realpath(os.path.dirname(os.path.abspath(out))) == os.path.realpath(report_dir)
        if same_dir and REPORT_FILE.fullmatch(os.path.basename(out)):
            raise UserError(
                f"--{flag.replace('_', '-')} {out}: a name the plugin's reports take in --report-dir "
                f"{report_dir}: the run would replace it (give another name or directory)"
            )
    files.check_directory(report_dir, "--report-dir")


def _check_launcher(args) -> None:
    if args.launcher != "ray":
        for flag, value in (("--ray-address", args.ray_address), ("--traceback-out", args.traceback_out)):
            if value is not None:
                raise UserError(f"{flag} {value} goes with --launcher ray")
    if args.ray_timeout is not None:
        if args.ray_address is None:
            raise UserError(f"--ray-timeout {args.ray_timeout:g} goes with --ray-address (joining a cluster)")
    if args.launcher != "ray":
        return
    ray_session.require("--launcher ray")
    if args.ray_address is not None and not args.ray_address.strip():
        raise UserError("--ray-address: empty (give HOST:PORT of the cluster's head, or leave it out)")


def _via(args) -> Launcher:
    timeout = args.ray_timeout if args.ray_timeout is not None else ray_session.TIMEOUT_S
    return Launcher(args.launcher or "torchrun", args.ray_address, timeout)


def _ray_output(args, result, doc: dict) -> None:
    """--launcher ray: the as-is failure's traceback (the driver's) printed, in the JSON, and in --traceback-out."""
    reps = _repros(result, doc)
    for rep, where in reps:
        where["traceback"] = rep.traceback
    doc["launcher"] = {"kind": "ray", "ray_address": args.ray_address}
    shown = next(((rep, text) for rep, _ in reps if (text := rep.traceback)), None)
    if shown is None:
        return
    rep, text = shown
    say = terminal.printer()  # folded at the terminal's width, as every line of repro's
    say(shown_traceback(rep.hazard, rep.loss, text))
    if args.traceback_out:
        files.write_text(args.traceback_out, text, "--traceback-out")
        say(doctor_line(args.traceback_out))


def shown_traceback(hazard: str, loss: str, text: str) -> str:
    """The Ray driver's traceback as repro prints it: a line saying whose, then the text (its last newline the
    print's)."""
    head = f"\nthe Ray driver's traceback ({hazard}, {loss} loss), as slime's train.py shows it:\n"
    return head + (text[:-1] if text.endswith("\n") else text)


def doctor_line(traceback_out: str) -> str:
    """The one line after --traceback-out: where the harness's launch script is, and doctor's command for the file."""
    command = f"nanscope doctor --case {case.HARNESS} --traceback {shlex.quote(traceback_out)}"
    return f"diagnose it in the harness's world (its launch script: {case.harness_script()}): {command}"


def _repros(result, doc: dict) -> list:
    """(Repro, its dict in the JSON `doc`) of each run of a result, the as-is runs first."""
    if isinstance(result, repro.Matrix):
        rows = list(zip(result.rows, doc["matrix"]))
        return [(row.as_is, out["as_is"]) for row, out in rows] + [(row.safe, out["safe"]) for row, out in rows]
    if isinstance(result, repro.StepsCheck):
        return [(result.as_is, doc["as_is"]), (result.safe, doc["safe"])]
    if isinstance(result, natural.NaturalCheck):
        return [(result.as_is, doc["natural"]["as_is"]), (result.plugin, doc["natural"]["plugin"])]
    return [(result, doc)]


# The flags of a launch, which --list-modules would ignore (--loss, --seed and --timeout have defaults).
_LAUNCH_FLAGS = ("all", "hazard", "steps", "inject_step", "trace", "plugin", "fault", "fault_step", "fault_once",
                 "launcher", "ray_address", "ray_timeout", "traceback_out", "natural", "lr")  # fmt: skip


def _list_modules(args) -> int:
    """`--list-modules`: the harness model's module names, one a line; with --json, {"modules": [...]}."""
    from nanscope.megatron import faults  # heavy: torch

    names = list(faults.module_names())
    if args.json:
        files.write_json(args.json, {"modules": names})
    print("\n".join(names))
    return 0


def _max_skips() -> int | None:
    """NANSCOPE_MAX_SKIPS from the environment, checked as the plugin's hook checks it."""
    from nanscope.slime_plugin.settings import Settings  # heavy: the plugin's package imports torch

    try:
        return Settings.from_env({"NANSCOPE_MAX_SKIPS": os.environ.get("NANSCOPE_MAX_SKIPS", "")}).max_skips
    except ValueError as e:
        raise UserError(str(e)) from None


def _natural(args, console):
    """`--natural`: the loop as-is and with the plugin, rendered; (the check, its JSON)."""
    from nanscope.report import natural as report  # heavy: rich

    with progress.Lines("repro", quiet=args.quiet) as lines:
        result = natural.run_natural(
            seed=args.seed,
            steps=args.steps or natural.DEFAULT_STEPS,
            lr=args.lr or natural.DEFAULT_LR,
            timeout_s=args.timeout,
            via=_via(args),
            progress=lines,
        )
    report.render(result, console)
    return result, report.to_json(result)


def run(args) -> int:
    try:
        return _run(args)
    except Interrupted as e:
        terminal.note(f"nanscope repro: interrupted; {e.workers} workers stopped")
        return e.exit_code


def _run(args) -> int:
    from nanscope.report import repro as report  # heavy: rich

    validate(args)
    files.check_outputs({"--json": args.json, "--traceback-out": args.traceback_out})
    if args.list_modules:
        return _list_modules(args)
    if args.ray_address is not None:  # nothing there: one line now, not a launch that waits on it
        ray_session.probe(args.ray_address, _via(args).ray_timeout_s)
    console = terminal.console()
    if args.slime_src is not None:
        code, doc = repro_slime.run(args, args.sources, console)
        if args.traceback_out and doc.get("as_is", {}).get("traceback"):
            files.write_text(args.traceback_out, doc["as_is"]["traceback"], "--traceback-out")
        if args.json:
            files.write_json(args.json, doc)
        return code
    if args.natural:
        result, doc = _natural(args, console)
    elif args.steps is not None:
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
            report_dir=(args.report_dir or REPORT_DIR) if args.plugin else None,
            via=_via(args),
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
            fault_once=args.fault_once,
            via=_via(args),
        )
        report.render(result, console)
        doc = report.to_json(result)
    else:
        hazards = catalogue.CATALOGUE if args.all else catalogue.CASE_HAZARDS
        with progress.Lines("repro", quiet=args.quiet, total=2 * len(hazards)) as lines:
            result = repro.run_matrix(
                seed=args.seed, timeout_s=args.timeout, via=_via(args), hazards=hazards, progress=lines
            )
        report.render_matrix(result, console)
        doc = report.matrix_to_json(result)
    if args.launcher == "ray":
        _ray_output(args, result, doc)
    if args.json:
        files.write_json(args.json, doc)
    return 0 if result.ok else 1
