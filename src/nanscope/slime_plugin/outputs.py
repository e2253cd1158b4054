"""The plugin's files: a report on a non-finite step, the micro-batch it names, and a traced step's trace.

On a non-finite step every rank with a non-finite value writes `rollout<R>_step<S>_rank<K>.json` (the
first module in forward and backward order, its micro-batch, its class, and the `replay` instruction for a rerun
on the cluster: the same NANSCOPE_TRACE_STEP on every rank) and `.bundle.pt`, the repro bundle that
`nanscope trace` replays offline (`nanscope.trace.bundles.bundle`). Both are written when the step's vote finds it
non-finite, before anything else can fail; the rerun's verdict is added to the report afterwards (`add`). A
traced step writes `rollout<R>_step<S>_rank<K>.trace.json` with this rank's trace and `first`, the first
producer over all ranks.

Every file is written to a temporary file in the report directory and renamed into place: a link at the
file's name is replaced, never followed, and a reader never sees half a file. A file that cannot be written
(full disk, permissions, a directory at its name) is one warning line; the run goes on as without it. A rank
writes at most `max_bundles` bundles per run (NANSCOPE_MAX_BUNDLES); later reports say theirs was left out.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

from nanscope.outputs import replacing, system_directory
from nanscope.slime_plugin.coords import Coords
from nanscope.trace.bundles.bundle import SUFFIX


def check_dir(report_dir: str) -> str | None:
    """Why `report_dir` cannot take reports (a system directory or one of credentials, `nanscope.outputs`; else
    created if missing and a file must be writable in it), else None."""
    problem = system_directory(report_dir)
    if problem:
        return f"NANSCOPE_REPORT_DIR={report_dir!r}: {problem}: give a directory of the run's own"
    try:
        os.makedirs(report_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=report_dir, prefix=".nanscope-probe-"):
            pass
    except OSError as e:
        return f"NANSCOPE_REPORT_DIR={report_dir!r}: cannot write reports there: {e.strerror or e}"
    return None


def say(text: str) -> None:
    """A line of the plugin's on stdout; a stdout that fails (a full disk under a log file, a closed pipe) never
    ends the run, nor makes this rank skip a collective its peers take."""
    with contextlib.suppress(Exception):
        print(text, flush=True)


def warn(text: str) -> None:
    """One warning line: the plugin's own failures never end the run they watch."""
    say(f"nanscope: warning: {text}")


def replay_instruction(args, rollout_id, step_id) -> dict:
    """How to rerun a step under the tracer: one env var plus slime's --load-debug-rollout-data."""
    saved = getattr(args, "save_debug_rollout_data", None) or getattr(args, "load_debug_rollout_data", None)
    data = saved or "<the --save-debug-rollout-data path; this run saved no rollouts>"
    return {
        "NANSCOPE_TRACE_STEP": f"{rollout_id}:{step_id}",
        "load_debug_rollout_data": saved,
        "text": f"rerun from the checkpoint before rollout {rollout_id} with NANSCOPE_TRACE_STEP={rollout_id}:"
        f"{step_id} in the environment and --load-debug-rollout-data {data}",
    }


class Reports:
    """Writes this rank's files into the report directory and remembers their paths."""

    def __init__(self, report_dir: str, coords: Coords, max_bundles: int = 8):
        self.dir, self.coords, self.max_bundles = report_dir, coords, max_bundles
        self.paths: list[str] = []
        self.bundles = 0  # bundles written by this installation
        self._last: tuple[str | None, dict] = (None, {})  # the last report: its path and what it holds

    def stem(self, where: dict) -> str:
        name = f"rollout{where['rollout_id']}_step{where['step_id']}_rank{self.coords.rank}"
        return os.path.join(self.dir, name)

    def report(self, doc: dict, where: dict, bundle: dict | None) -> str | None:
        """`<stem>.json` holding `doc` (with `bundle`, and `microbatch_file` naming the same file), and
        `<stem>.bundle.pt` holding `bundle` (`nanscope.trace.bundles.bundle`), unless this rank wrote `max_bundles`.

        A failed write is one warning line: the report without its bundle, or None without the report.
        """
        stem = self.stem(where)
        path = None
        if bundle is not None and self.bundles >= self.max_bundles:
            doc = {**doc, "bundle_left_out": f"NANSCOPE_MAX_BUNDLES={self.max_bundles}: this rank wrote as many"}
        elif bundle is not None:
            path = self._write(stem + SUFFIX, "repro bundle", lambda f: _torch_save(bundle, f))
            self.bundles += path is not None
        doc = {**doc, "microbatch_file": path, "bundle": path}
        report = self._write(stem + ".json", "report", lambda f: f.write(_json(doc)))
        self.paths += [p for p in (report, path) if p is not None]
        self._last = (report, doc)
        return report

    def add(self, path: str, **keys) -> None:
        """Rewrite the last report written, at `path`, with `keys` added (e.g. the rerun's verdict)."""
        last, doc = self._last
        if last == path:
            self._write(path, "report", lambda f: f.write(_json({**doc, **keys})))

    def trace(self, doc: dict, where: dict) -> str | None:
        """`<stem>.trace.json` holding `doc` (a failed write: one warning line and None)."""
        path = self._write(
            self.stem(where) + ".trace.json", "trace", lambda f: f.write(json.dumps(doc, indent=1).encode())
        )
        if path is not None:
            self.paths.append(path)
        return path

    def _write(self, path: str, what: str, write) -> str | None:
        """`write(binary file)` into a temporary file beside `path`, renamed to `path` (`nanscope.outputs`); None and
        a warning when anything fails (torch.save raises RuntimeError on a full disk, os.replace IsADirectoryError)."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            with replacing(path) as temporary, open(temporary, "wb") as f:  # a link at `path` is replaced
                write(f)
            return path
        except Exception as e:  # nanscope's own failure: never the end of the run
            reason = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
            warn(
                f"rank {self.coords.rank}: could not write its {what} {os.path.basename(path)} to {self.dir}: {reason}"
            )
            return None


def _torch_save(obj, f) -> None:
    import torch  # heavy: torch, imported by the run already

    torch.save(obj, f)


def _json(doc: dict) -> bytes:
    return json.dumps(_ordered(doc), indent=1).encode()


# The report's keys, in the order its JSON has always listed them (then the keys added since).
_ORDER = (
    "rank", "rollout_id", "step_id", "mode", "time", "first_forward", "first_backward", "nonfinite_grads",
    "microbatch_file", "replay", "class", "class_candidates", "class_evidence", "rerun", "bundle",
)  # fmt: skip


def _ordered(doc: dict) -> dict:
    return {k: doc[k] for k in _ORDER if k in doc} | {k: v for k, v in doc.items() if k not in _ORDER}
