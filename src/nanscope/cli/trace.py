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

import argparse
import contextlib
import os
import sys
from pathlib import Path

from nanscope import case
from nanscope.causes import catalogue
from nanscope.cli import numbers
from nanscope.errors import UserError
from nanscope.facts import ranges
from nanscope.facts.paths import BUNDLE_SUFFIX, OLD_REPORT_DIRS, REPORT_DIR, REPORT_FILE
from nanscope.inputs import MiB, directory_files, fill_template, printable, read_json, skipped_lines
from nanscope.loss import NAMES as LOSS_NAMES
from nanscope.report import files, trace_dir
from nanscope.trace.bundles import bundle_text, verl_bundle
from nanscope.trace.tracer import text as render

DEFAULT_LIMIT_MB = 4096  # case-sized logits are several GB (replay.select_samples keeps fewer samples)
REPORT_LIMIT = 16 * MiB  # a report or trace JSON the plugin writes is a few kB

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
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        return _directory(args)
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
        return [(_member(name), Path(args.file) / name) for name in _members(Path(args.file))] + named
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
            print(printable(f"nanscope trace: {path}: missing; reading {other}, its old spelling"), file=sys.stderr)
            return other
    return path


def _under(path: str, directory: str) -> bool:
    return os.path.realpath(path).startswith(os.path.join(os.path.realpath(directory), ""))


def _members(root: Path) -> list[str]:
    """The names of the files of a report directory that `nanscope trace` reads, sorted."""
    return [path.name for path in directory_files(root, "*")[0] if _ours(path.name)]


def _skipped(root: Path) -> list[tuple[Path, str]]:
    """The entries of a report directory named like the plugin's files that are no regular files (a FIFO, a device,
    a directory): not read, and said so."""
    return [(path, what) for path, what in directory_files(root, "*")[1] if _ours(path.name)]


def _member(name: str) -> str:
    """What a report directory's file is, in a refusal."""
    if name.endswith(BUNDLE_SUFFIX):
        return "repro bundle"
    return (
        "cluster trace" if name.endswith(".trace.json") else "report" if name.endswith(".json") else "micro-batch file"
    )


def _kind(path: str) -> str:
    if os.path.isdir(path) and not str(path).endswith(".pt"):  # a directory named like a file is refused as one
        return "directory"
    return "bundle" if str(path).endswith(BUNDLE_SUFFIX) else "file"


def _limit(args) -> int:
    return args.max_input_mb  # in bytes (numbers.MEBIBYTES)


def _bundle(args) -> int:
    from nanscope.trace.bundles import bundle_load, bundle_replay  # heavy: torch

    doc = bundle_load.load(args.file, _limit(args), "--max-input-mb", other=verl_bundle.is_verl)
    if verl_bundle.is_verl(doc):  # nanscope.verl_plugin's: through the installed verl's ppo_loss
        save = (lambda d: files.write_json(args.json, {"source": args.file, "verl_bundle": d})) if args.json else None
        return verl_bundle.main(args.file, verl_bundle.checked(args.file, doc), show=lambda t: print(printable(t)),
                                save=save)  # fmt: skip
    with bundle_replay.loss_path(doc, args.slime_src) as path:
        rollout = _rollout(args, doc)
        try:
            result = bundle_replay.replay(
                doc, path, source=args.file, rollout=rollout, allow=tuple(args.allow), device=args.device
            )
        except UserError as e:  # the bundle's args or tensors: name the file
            raise UserError(f"{args.file}: {e}") from None
    out = result.to_dict()
    for line in bundle_text.lines(out):
        print(printable(line))
    if args.json:
        files.write_json(args.json, {"source": args.file, "bundle": out})
    return 1 if result.found else 0


def _rollout(args, doc: dict, cache: dict | None = None):
    """(path, token tuples per row) of the step's rollout dump: --rollout, else the one the bundle's args name.

    cache: the last dump read, kept for the next bundle of the same rollout (one dump at a time: a run's dumps
    are case-sized)."""
    from nanscope.dumps.io import load_rollout  # heavy: numpy and torch

    named = [(f"args: {k}", doc["args"].get(k)) for k in ("save_debug_rollout_data", "load_debug_rollout_data")]
    candidates = (
        [("--rollout", args.rollout)] if args.rollout else [(k, v) for k, v in named if isinstance(v, str) and v]
    )
    for what, template in candidates:
        path = fill_template(template, what, rollout_id=doc["rollout_id"], rank=doc["coords"]["rank"])
        if not args.rollout and not os.path.isfile(path):
            continue
        if cache is not None and path in cache:
            return cache[path]
        files.check_outputs({"--json": args.json}, [("rollout dump", path)])
        try:
            samples = load_rollout(path)
        except ValueError as e:
            if args.rollout:
                raise UserError(f"--rollout: {e}") from None
            continue  # a dump the run named but this machine cannot read: rows stay unknown, said so
        found = (path, [tuple(sample["tokens"].tolist()) for sample in samples])
        if cache is not None:
            cache.clear()
            cache[path] = found
        return found
    return None


def _directory(args) -> int:
    """Every bundle, report and trace of a run's report directory, one line per rank and step, earliest first.
    A file that cannot be read is one `refused:` line naming it and its field; the others are still listed."""
    root = Path(args.file)
    names = _members(root)
    for line in skipped_lines(_skipped(root)):
        print(f"nanscope trace: {line}", file=sys.stderr)
    replays, refused = [], []
    for result, refusal in _replay_each(args, root, [n for n in names if n.endswith(BUNDLE_SUFFIX)]):
        replays += [result] if result is not None else []
        refused += [refusal] if refusal is not None else []
    replays.sort(key=_order)
    rows = _bundle_rows(replays)
    for name in names:
        path = root / name
        with _refusing(args, path, refused):
            if name.endswith(".trace.json"):
                rows.append(_trace_row(path))
            elif name.endswith(".json") and not (root / (name[: -len(".json")] + BUNDLE_SUFFIX)).exists():
                rows.append(_report_row(path))
            elif name.endswith(".pt") and not name.endswith(BUNDLE_SUFFIX):
                rows.append(_pt_row(path, args))
    if not rows and not refused:
        raise UserError(f"{root}: report directory: no bundle (*{BUNDLE_SUFFIX}), report or trace in it")
    print(printable(f"nanscope trace: {root}: {len(replays)} bundles, {len(rows) - len(replays)} other files"))
    said = trace_dir.loss_lines(replays, args.slime_src) if replays else []
    for line in said + [line for _, line in sorted(rows, key=lambda row: row[0])]:
        print(printable(line))
    verdict = trace_dir.verdict_line(replays) if replays else None
    for line in (trace_dir.guard_lines(replays) + [verdict]) if replays else []:
        print(printable(line))
    for line in refused:
        print(printable(f"refused: {line}"))
    if args.json:
        doc = {"source": str(root), "bundles": replays, "refused": refused, "verdict": verdict}
        files.write_json(args.json, doc)
    if any(r["found"] for r in replays):
        return 1
    if refused:  # exit 2 says why on stderr, as every exit 2 does
        more = f"; the first: {refused[0]}" if len(refused) > 1 else f": {refused[0]}"
        raise UserError(f"{len(refused)} of {len(names)} files refused (the refused: lines above){more}")
    return 0


@contextlib.contextmanager
def _refusing(args, path: Path, refused: list[str]):
    """A file's UserError, or a bug its content hit (--debug: raised), as its `refused:` line; never the end of
    the listing."""
    try:
        yield
    except UserError as e:
        text = str(e)
        refused.append(text if text.startswith(str(path)) else f"{path}: {e}")
    except Exception as e:  # noqa: BLE001 - one file's bug must not lose the other files' lines
        if getattr(args, "debug", False):
            raise
        why = (str(e).strip().splitlines() or [""])[0][:300]
        refused.append(f"{path}: internal error: {type(e).__name__}: {why} (rerun with --debug for the traceback)")


def _replay_each(args, root: Path, names: list[str]):
    """Each bundle read, replayed and dropped in turn: yields (its replay's dict or None, its refusal or None).
    One bundle's tensors are in memory at a time, and one rollout dump (`_rollout`'s cache)."""
    dumps: dict = {}  # the last rollout dump read
    with contextlib.ExitStack() as stack:
        losses = _Losses(args.slime_src, stack)
        for name in names:
            refused: list[str] = []
            result = None
            with _refusing(args, root / name, refused):
                result = _replay_one(args, root / name, losses, dumps)
            yield result, (refused[0] if refused else None)


def _replay_one(args, path: Path, losses: _Losses, dumps: dict) -> dict:
    """One bundle's replay, as its to_dict(); the bundle is dropped when this returns."""
    from nanscope.trace.bundles import bundle_load, bundle_replay  # heavy: torch

    doc = bundle_load.load(path, _limit(args), "--max-input-mb")
    rollout = _rollout(args, doc, dumps)
    return bundle_replay.replay(doc, losses.path(doc), source=str(path), rollout=rollout, device=args.device).to_dict()


class _Losses:
    """The loss each bundle of a directory replays through: one release's imported at a time (a checkout's modules
    leave sys.modules before another's come in), kept while the bundles after it share the release; a release whose
    loss cannot be imported is refused for each of its bundles, tried once."""

    def __init__(self, slime_src: str | None, stack: contextlib.ExitStack):
        self.slime_src, self.stack = slime_src, stack
        self.release, self.current = None, None
        self.broken: dict[tuple, str] = {}  # release -> why its loss cannot be imported

    def path(self, doc: dict):
        from nanscope.trace.bundles import bundle_replay  # heavy: torch

        key = (doc["release"]["module"], doc["release"]["name"])
        if key in self.broken:
            raise UserError(self.broken[key])
        if key != self.release:
            self.stack.close()
            self.release, self.current = None, None
            try:
                self.current = self.stack.enter_context(bundle_replay.loss_path(doc, self.slime_src))
            except UserError as e:
                self.broken[key] = str(e)
                raise
            self.release = key
        return self.current


def _bundle_rows(replays: list[dict]) -> list[tuple]:
    """(order, line) of each replayed bundle; a finite rank's line names the ranks of its step whose loss does not."""
    named: dict[tuple, list[int]] = {}  # (rollout, step) -> ranks whose loss replays non-finite
    for r in replays:
        if r["found"]:
            named.setdefault((r["rollout_id"], r["step_id"]), []).append(r["coords"]["rank"])
    return [(_order(r), bundle_text.summary_line(r, named.get((r["rollout_id"], r["step_id"]), []))) for r in replays]


def _ours(name: str) -> bool:
    """A file the plugin writes into its report directory (any *.bundle.pt too)."""
    return name.endswith(BUNDLE_SUFFIX) or REPORT_FILE.fullmatch(name) is not None


def _order(doc: dict) -> tuple:
    coords = doc.get("coords") or {}
    return (doc["rollout_id"], doc["step_id"], coords["rank"], 0, coords["cp_rank"])


def _json(path: Path, what: str) -> dict:
    doc = read_json(path, what, REPORT_LIMIT)
    bounds = (("rollout_id", ranges.MAX_ID), ("step_id", ranges.MAX_ID), ("rank", ranges.MAX_RANK))
    ints = isinstance(doc, dict) and all(ranges.in_range(doc.get(k), 0, high) for k, high in bounds)
    if not ints:
        raise UserError(
            f"{path}: {what}: expected a dict with integer rollout_id and step_id (0 to 2^63-1) and rank (0 to 2^31-1)"
        )
    return doc


def _report_row(path: Path) -> tuple:
    doc = _json(path, "report")
    problem = bundle_text.report_problem(doc)
    if problem:
        raise UserError(f"{path}: report: {problem}")
    where = f"rollout {doc['rollout_id']} step {doc['step_id']}, rank {doc['rank']}"
    line = f"{where}: report only, no bundle: {bundle_text.sentinel_text(doc)}; class {doc.get('class') or 'undecided'}"
    return (doc["rollout_id"], doc["step_id"], doc["rank"], 1, 0), line


def _trace_row(path: Path) -> tuple:
    doc = _json(path, "trace")
    first = doc.get("first") if isinstance(doc.get("first"), dict) else {}
    where = f"rollout {doc['rollout_id']} step {doc['step_id']}, rank {doc['rank']}"
    try:
        said = "; ".join(render.first_lines(first))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError(f"{path}: trace: 'first' is not a trace's first producers") from None
    return (
        doc["rollout_id"],
        doc["step_id"],
        doc["rank"],
        2,
        0,
    ), f"{where}: cluster trace (NANSCOPE_TRACE_STEP): {said}"


def _pt_row(path: Path, args) -> tuple:
    from nanscope.trace.tracer import replay  # heavy: torch

    try:
        replay.load_microbatch(path, _limit(args), "--max-input-mb")
    except UserError as e:  # the old sentinel format says what to do instead
        return (-1, -1, -1, 3, 0), f"not replayed: {e}"
    return (-1, -1, -1, 3, 0), f"{path}: a micro-batch file: nanscope trace {path}"


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
        doc = replay.load_microbatch(args.file, _limit(args), "--max-input-mb")
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

    print(printable(f"nanscope trace: {what} through the {doc['loss']} loss ({report.ops_seen} aten ops traced)"))
    if site is not None:
        token = f", response token {site[1]}" if site[1] is not None else ""
        print(f"hazard site: sample {site[0]}{token}")
    for line in render.lines(report):
        print(printable(line))
    if args.json:
        out = {
            "source": what,
            "loss": doc["loss"],
            "hazard_site": list(site) if site else None,
            "trace": report.to_dict(),
        }
        files.write_json(args.json, out)
    return 0
