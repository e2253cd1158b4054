"""`nanscope trace REPORT_DIR`: every bundle, report and cluster trace of a run's report directory, one line per rank
and step, earliest first; then the guard's replay and the verdict. `cli/trace.py` hands a directory here."""

from __future__ import annotations

import contextlib
from pathlib import Path

from nanscope.cli import terminal, trace_inputs
from nanscope.errors import UserError
from nanscope.facts import ranges
from nanscope.facts.paths import BUNDLE_SUFFIX, REPORT_FILE
from nanscope.inputs import MiB, directory_files, printable, read_json, skipped_lines
from nanscope.launch import words
from nanscope.report import files, trace_dir
from nanscope.trace.bundles import bundle_text
from nanscope.trace.tracer import text as render

REPORT_LIMIT = 16 * MiB  # a report or trace JSON the plugin writes is a few kB


def members(root: Path) -> list[str]:
    """The names of the files of a report directory that `nanscope trace` reads, sorted."""
    return [path.name for path in directory_files(root, "*")[0] if _ours(path.name)]


def skipped(root: Path) -> list[tuple[Path, str]]:
    """The entries of a report directory named like the plugin's files that are no regular files (a FIFO, a device,
    a directory): not read, and said so."""
    return [(path, what) for path, what in directory_files(root, "*")[1] if _ours(path.name)]


def member(name: str) -> str:
    """What a report directory's file is, in a refusal."""
    if name.endswith(BUNDLE_SUFFIX):
        return "repro bundle"
    return (
        "cluster trace" if name.endswith(".trace.json") else "report" if name.endswith(".json") else "micro-batch file"
    )


def run(args, say) -> int:
    """Every bundle, report and trace of a run's report directory, one line per rank and step, earliest first, each
    through `say` (stdout at the terminal's width). A file that cannot be read is one `refused:` line naming it and
    its field; the others are still listed."""
    root = Path(args.file)
    names = members(root)
    for line in skipped_lines(skipped(root)):
        terminal.note(f"nanscope trace: {line}")
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
    bundles, others = words.count(len(replays), "bundle"), words.count(len(rows) - len(replays), "other file")
    say(printable(f"nanscope trace: {root}: {bundles}, {others}"))
    said = trace_dir.loss_lines(replays, args.slime_src) if replays else []
    for line in said + [line for _, line in sorted(rows, key=lambda row: row[0])]:
        say(printable(line))
    verdict = trace_dir.verdict_line(replays) if replays else None
    for line in (trace_dir.guard_lines(replays) + [verdict]) if replays else []:
        say(printable(line))
    for line in refused:
        say(printable(f"refused: {line}"))
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
    One bundle's tensors are in memory at a time, and one rollout dump (`trace_inputs.rollout`'s cache)."""
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

    doc = bundle_load.load(path, trace_inputs.limit(args), "--max-input-mb")
    rollout = trace_inputs.rollout(args, doc, dumps)
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
        replay.load_microbatch(path, trace_inputs.limit(args), "--max-input-mb")
    except UserError as e:  # the old sentinel format says what to do instead
        return (-1, -1, -1, 3, 0), f"not replayed: {e}"
    return (-1, -1, -1, 3, 0), f"{path}: a micro-batch file: nanscope trace {path}"
