"""Scanning a directory's dumps as Ray tasks (`nanscope scan DIR --ray`): one file a task, read where it lies.

    with ray_session.session(address, cpus=n):      # the caller joins or starts Ray (nanscope.megatron.ray_session)
        summaries = ray_scan.scan_files(paths, flags)

Each task runs `many.scan_file`, the local parallel mode's own function, on one path, on whichever node Ray picks:
the path must be readable there (shared storage on a cluster), since the file is read where it lies, never sent.
The summaries come back in the paths' order, so the summary, JSON and HTML are those of the local mode. A task
that fails in Ray (its worker died, its result could not come back) is that file's one-line error, as a file
that cannot be read is in the local mode; never the run's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.limits import Limits
from nanscope.dumps.many import FileSummary, scan_file

POLL_S = 0.25


def scan_files(
    paths: list[Path],
    flags: ScanFlags,
    *,
    trust_pickle: bool = False,
    cp_size: int = 1,
    tp_size: int = 1,
    limits: Limits | None = None,
    workers: int | None = None,
    done: Callable[[FileSummary], None] | None = None,
) -> list[FileSummary]:
    """Scan `paths` as Ray tasks (Ray is initialised), at most `workers` at once (default: as Ray schedules them).

    Args:
        done: called with each summary as its file finishes (in completion order).
    """
    import ray  # optional: the nanscope[ray] extra, only scan --ray uses it

    load = dict(trust_pickle=trust_pickle, cp_size=cp_size, tp_size=tp_size, limits=limits or Limits())
    task = ray.remote(num_cpus=1, max_retries=0)(scan_file)
    limit = workers or len(paths)
    todo, running, out = [str(p) for p in reversed(paths)], {}, {}
    while todo or running:
        while todo and len(running) < limit:
            path = todo.pop()
            running[task.remote(path, flags, load)] = path
        ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
        for ref in ready:
            path = running.pop(ref)
            out[path] = _summary(ref, path)
            if done is not None:
                done(out[path])
    return [out[str(p)] for p in paths]


def _summary(ref, path: str) -> FileSummary:
    """The task's summary, or its failure as the file's one-line error."""
    import ray  # optional: the nanscope[ray] extra

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        return failed(path, e)


def failed(path: str, e: BaseException) -> FileSummary:
    """A file whose task failed in Ray (`e`: RayTaskError, WorkerCrashedError, ...): its summary, a one-line error."""
    text = str(getattr(e, "cause", None) or e).strip().splitlines()
    line = text[0][:200] if text else ""
    return FileSummary(path, error=f"{path}: Ray task failed: {type(e).__name__}: {line}".rstrip(": "))
