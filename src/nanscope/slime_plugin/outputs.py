"""The plugin's files: a report on a non-finite step, the micro-batch it names, and a traced step's trace.

On a non-finite step every rank with a non-finite value writes `rollout<R>_step<S>_rank<K>.json` (the
first module in forward and backward order, its micro-batch, its class, and the `replay` instruction for a rerun
on the cluster: the same NANSCOPE_TRACE_STEP on every rank) and `.bundle.pt`, the repro bundle that
`nanscope trace` replays offline (`nanscope.trace.bundle`). A traced step writes `rollout<R>_step<S>_rank<K>.trace.json` with this rank's
trace and `first`, the first producer over all ranks.
"""

from __future__ import annotations

import json
import os
import tempfile

from nanscope.slime_plugin.coords import Coords
from nanscope.trace.bundle import SUFFIX


def check_dir(report_dir: str) -> str | None:
    """Why `report_dir` cannot take reports (created if missing; a file must be writable in it), else None."""
    try:
        os.makedirs(report_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=report_dir, prefix=".nanscope-probe-"):
            pass
    except OSError as e:
        return f"NANSCOPE_REPORT_DIR={report_dir!r}: cannot write reports there: {e.strerror or e}"
    return None


def warn(text: str) -> None:
    """One warning line: the plugin's own failures never end the run they watch."""
    print(f"nanscope: warning: {text}", flush=True)


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

    def __init__(self, report_dir: str, coords: Coords):
        self.dir, self.coords = report_dir, coords
        self.paths: list[str] = []

    def stem(self, where: dict) -> str:
        os.makedirs(self.dir, exist_ok=True)
        name = f"rollout{where['rollout_id']}_step{where['step_id']}_rank{self.coords.rank}"
        return os.path.join(self.dir, name)

    def report(self, doc: dict, where: dict, bundle: dict | None) -> str | None:
        """`<stem>.json` holding `doc` (with `bundle`, and `microbatch_file` naming the same file), and
        `<stem>.bundle.pt` holding `bundle` (`nanscope.trace.bundle`).

        A failed write (full disk, permissions) is one warning line and None: the run goes on.
        """
        try:
            return self._report(doc, where, bundle)
        except OSError as e:
            warn(f"rank {self.coords.rank}: could not write its report to {self.dir}: {e.strerror or e}")
            return None

    def _report(self, doc: dict, where: dict, bundle: dict | None) -> str:
        import torch  # heavy: torch, imported by the run already

        stem = self.stem(where)
        path = stem + SUFFIX if bundle is not None else None
        if path is not None:
            torch.save(bundle, path)
        doc = {**doc, "microbatch_file": path, "bundle": path}
        with open(stem + ".json", "w") as f:
            json.dump(_ordered(doc), f, indent=1)
        self.paths += [stem + ".json"] + ([path] if path else [])
        return stem + ".json"

    def trace(self, doc: dict, where: dict) -> str | None:
        """`<stem>.trace.json` holding `doc` (a failed write: one warning line and None)."""
        try:
            path = self.stem(where) + ".trace.json"
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)
        except OSError as e:
            warn(f"rank {self.coords.rank}: could not write its trace to {self.dir}: {e.strerror or e}")
            return None
        self.paths.append(path)
        return path


# The report's keys, in the order its JSON has always listed them (then the keys added since).
_ORDER = (
    "rank", "rollout_id", "step_id", "mode", "time", "first_forward", "first_backward", "nonfinite_grads",
    "microbatch_file", "replay", "class", "class_candidates", "class_evidence", "rerun", "bundle",
)  # fmt: skip


def _ordered(doc: dict) -> dict:
    return {k: doc[k] for k in _ORDER if k in doc} | {k: v for k, v in doc.items() if k not in _ORDER}
