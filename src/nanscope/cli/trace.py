"""`nanscope trace`: replay a loss and name the op that first produced NaN or inf.

Every aten op of the forward and the backward pass is checked (TorchDispatchMode). The producer is
the first op whose output holds NaN (or +-inf) that none of its inputs held; ops downstream of it
only propagate and are not blamed. For each phase it prints the op, the autograd node (backward),
the source line, and the sample and token of the first bad entry. A non-finite value that no op
produced came from an input: the batch keys that hold one are listed.

Input, one of:
  BUNDLE.bundle.pt  a repro bundle the slime plugin wrote on a non-finite step (nanscope.trace.bundles.bundle): the
                    loss replayed offline from the recorded log-probs, through the release that wrote it (an
                    installed slime, or --slime-src DIR; else nanscope's model of slime v0.1.0, said so), then
                    through the guard. Exit 1 when it names the cause in the loss (an op of it, or a non-finite
                    input), 0 when the NaN started upstream of the loss (the loss replays finite, or the log-probs
                    the release computed from the logits were non-finite already): the report's module names where.
  REPORT_DIR        the plugin's report directory (NANSCOPE_REPORT_DIR): the loss its bundles replay through, one
                    line per rank and step, earliest first, for every bundle, report and cluster trace in it, then
                    the guard's replay and the verdict (the earliest bundle's that names the cause); exit 1 if any
                    bundle names the cause.
  FILE.pt           a micro-batch file written by nanscope.trace.tracer.replay.save_microbatch (batch, logits, args).
  --hazard NAME     a catalogued hazard, built against the synthetic policy as `nanscope hazards` does.
"""

from __future__ import annotations

import os
from pathlib import Path

from nanscope import case
from nanscope.causes import catalogue
from nanscope.cli import help, numbers, terminal, trace_directory, trace_inputs
from nanscope.errors import UserError
from nanscope.facts.paths import BUNDLE_SUFFIX, OLD_REPORT_DIRS, REPORT_DIR
from nanscope.inputs import fill_template, printable
from nanscope.loss import NAMES as LOSS_NAMES
from nanscope.report import files
from nanscope.trace.bundles import bundle_text, verl_bundle
from nanscope.trace.tracer import text as render

DEFAULT_LIMIT_MB = 4096  # case-sized logits are several GB (replay.select_samples keeps fewer samples)

EPILOG = """examples:
  nanscope trace /root/dumps/nanscope                   # the job died: every rank's report and bundle, one line each
  nanscope trace rollout12_step0_rank50.bundle.pt       # that rank's loss offline: op, source line, sample, token
  nanscope trace x.bundle.pt --slime-src ~/slime        # through that slime checkout's own loss (or ~/slime/v0.1.0)
  nanscope trace --hazard kl-exp-overflow               # exp overflow in low_var_kl, then 0 * inf in its backward
  nanscope trace --hazard nan-reward --loss safe        # the fix on the same batch: no producer
  nanscope trace mb.pt                                  # a file from nanscope.trace.tracer.replay.save_microbatch
  nanscope trace --hazard ratio-exp-overflow --json trace.json
"""


def add_parser(sub):
    p = sub.add_parser(
        "trace",
        help="name the op, source line and token that first produced NaN/inf in a replayed loss",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=help.Formatter,
    )
    p.add_argument(
        "file", nargs="?", metavar="BUNDLE|REPORT_DIR|FILE.pt", help="a repro bundle, a report directory, a micro-batch"
    )
    p.add_argument("--hazard", metavar="NAME", help="replay a catalogued hazard's micro-batch instead of a file")
    p.add_argument(
        "--loss", choices=LOSS_NAMES, help="FILE.pt, --hazard: loss to replay with (default: as-is, or the file's)"
    )
    p.add_argument(
        "--slime-src",
        metavar="DIR",
        help="a bundle: replay through this slime checkout's loss (DIR holds slime/, or one checkout per release: "
        "DIR/v0.1.0, DIR/v0.2.4, DIR/v0.3.1, DIR/main); needs megatron-core (nanscope[repro])",
    )
    p.add_argument(
        "--rollout",
        metavar="DUMP",
        help="a bundle: the step's rollout dump (--save-debug-rollout-data; '{rollout_id}' and '{rank}' are filled in, "
        "with a format spec of width <= 64 such as {rollout_id:04d}), to name samples by their dump row (default: "
        "the bundle's rows, else the dump its args name, when it is there)",
    )
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="OP",
        help="never blame this op (e.g. aten.masked_fill for intentional -inf masks); repeatable",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="also write the report as JSON (key 'trace'; a bundle: 'bundle'; a report directory: 'bundles', "
        "'refused', 'verdict'; docs/json.md)",
    )
    p.add_argument("--seed", type=numbers.SEED, default=0, help="seed of the hazard's batch, 0..2^32-1 (default 0)")
    p.add_argument(
        "--device",
        default="cpu",
        metavar="DEVICE",
        help="replay the loss on this torch device (default cpu; e.g. cuda, cuda:1 on the node the job ran on)",
    )
    p.add_argument(
        "--max-input-mb",
        type=numbers.MEBIBYTES,
        default=str(DEFAULT_LIMIT_MB),
        metavar="MB",
        help=f"refuse a FILE.pt or bundle larger than this (default {DEFAULT_LIMIT_MB})",
    )
    return p


def run(args) -> int:
    if (args.file is None) == (args.hazard is None):
        raise UserError("give either FILE.pt or --hazard NAME (not both)")
    if args.file is not None:
        args.file = _report_dir_spelling(args.file)
    kind = _kind(args.file) if args.file is not None else "hazard"
    if kind in ("bundle", "directory"):
        given = [flag for flag, on in (("--loss", args.loss), ("--hazard", args.hazard)) if on]
        if given:
            raise UserError(f"{given[0]} goes with FILE.pt or --hazard: a bundle replays the loss that wrote it")
    elif args.slime_src or args.rollout:
        raise UserError(f"{'--slime-src' if args.slime_src else '--rollout'} goes with a bundle or a report directory")
    if args.slime_src is not None and not os.path.isdir(args.slime_src):
        raise UserError(f"--slime-src {printable(args.slime_src)}: no such directory (give a slime checkout)")
    if args.rollout:  # a template that fills: refused once, here, not for every bundle
        fill_template(args.rollout, "--rollout", rollout_id=0, rank=0)
    if args.device != "cpu":
        _check_device(args.device)
    files.check_outputs({"--json": args.json}, _inputs(args, kind))
    if kind == "bundle":
        return _bundle(args)
    if kind == "directory":
        return trace_directory.run(args, _printer())
    return _microbatch(args)


def _check_device(text: str) -> None:
    """--device: a torch device this process can compute on (a replay reads its values: not meta)."""
    import torch  # heavy: only for a device other than the CPU

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {printable(text)}: not a torch device (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise UserError(f"--device {printable(text)}: torch sees {count} CUDA device(s) here")
    elif device.type != "cpu":
        raise UserError(f"--device {printable(text)}: the replay runs on cpu or cuda")


def _inputs(args, kind: str) -> list[tuple[str, str | Path]]:
    """(what, path) of every file the command will read, as far as known before it reads any: the file, a report
    directory's members, --rollout (the dump a bundle's args name is checked when it is known), a file of the
    --slime-src checkout."""
    named = [("rollout dump", args.rollout)] if args.rollout and "{" not in args.rollout else []
    if args.slime_src and args.json and _under(args.json, args.slime_src):  # the checkout whose code it imports
        named.append(("--slime-src file", args.json))
    if kind == "directory":
        root = Path(args.file)
        return [(trace_directory.member(name), root / name) for name in trace_directory.members(root)] + named
    if kind == "hazard":
        return []
    return [("repro bundle" if kind == "bundle" else "micro-batch file", args.file), *named]


def _report_dir_spelling(path: str) -> str:
    """`path`, or where it names the default report directory and that is missing, the old default's spelling beside
    it when that is there (`repro --plugin` wrote nanscope-reports before the one spelling), said on stderr."""
    if os.path.lexists(path) or os.path.basename(os.path.normpath(path)) != REPORT_DIR:
        return path
    for old in OLD_REPORT_DIRS:
        other = os.path.join(os.path.dirname(os.path.normpath(path)), old)
        if os.path.isdir(other):
            terminal.note(printable(f"nanscope trace: {path}: missing; reading {other}, its old spelling"))
            return other
    return path


def _under(path: str, directory: str) -> bool:
    return os.path.realpath(path).startswith(os.path.join(os.path.realpath(directory), ""))


def _kind(path: str) -> str:
    if os.path.isdir(path) and not str(path).endswith(".pt"):  # a directory named like a file is refused as one
        return "directory"
    return "bundle" if str(path).endswith(BUNDLE_SUFFIX) else "file"


def _bundle(args) -> int:
    from nanscope.trace.bundles import bundle_load, bundle_replay  # heavy: torch

    doc = bundle_load.load(args.file, trace_inputs.limit(args), "--max-input-mb", other=verl_bundle.is_verl)
    if verl_bundle.is_verl(doc):  # nanscope.verl_plugin's: through the installed verl's ppo_loss
        save = (lambda d: files.write_json(args.json, {"source": args.file, "verl_bundle": d})) if args.json else None
        return verl_bundle.main(args.file, verl_bundle.checked(args.file, doc), show=lambda t: _printer()(printable(t)),
                                save=save)  # fmt: skip
    with bundle_replay.loss_path(doc, args.slime_src) as path:
        rollout = trace_inputs.rollout(args, doc)
        try:
            result = bundle_replay.replay(
                doc, path, source=args.file, rollout=rollout, allow=tuple(args.allow), device=args.device
            )
        except UserError as e:  # the bundle's args or tensors: name the file
            raise UserError(f"{args.file}: {e}") from None
    out = result.to_dict()
    say = _printer()
    for line in bundle_text.lines(out):
        say(printable(line))
    if args.json:
        files.write_json(args.json, {"source": args.file, "bundle": out})
    return 1 if result.found else 0


def _printer():
    """stdout at the terminal's width (`cli.terminal`, as the other commands): a line longer than that, a rank's and
    step's or a source line's, goes on below it, indented."""
    return terminal.printer()


def _microbatch(args) -> int:
    from nanscope import hazards  # heavy: torch, which `nanscope --help` never needs
    from nanscope.trace.tracer import replay  # heavy: torch

    site = None
    if args.hazard is not None:
        if args.hazard not in catalogue.BY_NAME:
            raise UserError(f"--hazard {args.hazard}: unknown hazard; known: {', '.join(catalogue.BY_NAME)}")
        if catalogue.get(args.hazard).level == "model":
            raise UserError(
                f"--hazard {args.hazard}: a fault in the model, not in the loss's batch: "
                f"nanscope repro --hazard {args.hazard} --trace"
            )
        flags = case.loss_flags()
        doc, site = hazards.microbatch_document(args.hazard, args.loss or "as-is", flags=flags, seed=args.seed)
        what = f"hazard {args.hazard}"
    else:
        doc = replay.load_microbatch(args.file, trace_inputs.limit(args), "--max-input-mb")
        if args.loss:
            doc["loss"] = args.loss
        what = args.file
    try:
        report = replay.replay(doc, allow=tuple(args.allow), device=args.device)
    except ValueError as e:  # the loss refuses the file's args (e.g. an unmodelled advantage estimator)
        raise UserError(f"{what}: the {doc['loss']} loss rejected it: {e}") from None
    except (RuntimeError, IndexError) as e:  # a file's tensors that passed the checks but do not fit together
        if args.file is None:
            raise  # a catalogued hazard's batch is ours: a bug
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(
            f"{what}: the {doc['loss']} loss cannot run on its tensors: {type(e).__name__}: {why}"
        ) from None

    say = _printer()
    say(printable(f"nanscope trace: {what} through the {doc['loss']} loss ({report.ops_seen} aten ops traced)"))
    if site is not None:
        token = f", response token {site[1]}" if site[1] is not None else ""
        say(f"hazard site: sample {site[0]}{token}")
    for line in render.lines(report):
        say(printable(line))
    if args.json:
        out = {
            "source": what,
            "loss": doc["loss"],
            "hazard_site": list(site) if site else None,
            "trace": report.to_dict(),
        }
        files.write_json(args.json, out)
    return 0
