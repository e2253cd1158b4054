"""Scanning every dump under a directory, files in parallel on the available cores, one summary each.

Each file is scanned in a worker process (a forkserver that has imported the reader and the checks once),
so a slow or large file does not hold the others and a file's memory is returned when it is done. A file
that cannot be read is a summary with its one-line error, not the end of the batch. Anything that ends the
scan early (a stop signal the caller's `check` raises, Ctrl-C) ends the workers before it propagates: no
file is scanned after it, and no process is left behind, nor the pool's manager thread (`_join_manager`).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import active_children, get_context
from pathlib import Path
from typing import TYPE_CHECKING

from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.limits import Limits
from nanscope.errors import UserError
from nanscope.inputs import directory_files, skipped_lines

POLL_S = 0.25  # how often a directory's scan looks for a stop
MANAGER_GRACE_S = 30.0  # a stopped pool's manager thread ends within this (a hang bound: it ends once the workers have)

if TYPE_CHECKING:
    from nanscope.dumps.headroom import DumpHeadroom


@dataclass
class FileSummary:
    """One file's scan, small enough to send back from a worker.

    Attributes:
        path: the file.
        error: the one-line UserError that stopped its scan (unreadable, refused, malformed), or "".
        kind, rollout_id, rank, num_samples, response_tokens: as in ScanResult ("" / None / 0 on error).
        would_nan: "yes", "possibly", "no", or "" on error.
        mechanisms: as in ScanResult.
        counts: check kind -> findings (checks that ran).
        total: all findings.
        errors: the length errors slime v0.1.0 would fail on (ScanResult.errors).
        seconds: wall time of the file's scan.
        format: the release format it was read as (ScanResult.format.release), or "" on error.
        headroom: its log-ratio maxima and train-rollout gap (`nanscope.dumps.headroom`), None on error; the
            directory's trend (`nanscope.dumps.trend`) reads them.
    """

    path: str
    error: str = ""
    kind: str = ""
    rollout_id: object = None
    rank: int | None = None
    num_samples: int = 0
    response_tokens: int = 0
    would_nan: str = ""
    mechanisms: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    format: str = ""
    headroom: DumpHeadroom | None = None


def find_dumps(directory: str | Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The *.pt files under `directory` (recursively), sorted, and the entries named so that are no regular files
    (`nanscope.inputs.directory_files`); a directory without any dump is a UserError."""
    paths, skipped = directory_files(directory, "*.pt", recursive=True)
    if not paths:
        also = f" ({len(skipped)} named so are not regular files: {skipped_lines(skipped, 1)[0]})" if skipped else ""
        raise UserError(f"{directory}: no *.pt dumps in this directory or below{also}")
    return paths, skipped


def name_rollout(path: str | Path) -> int | None:
    """The rollout a dump's file name gives, as slime names them ({rollout_id}.pt, {rollout_id}_{rank}.pt), else
    None."""
    match = _DUMP_NAME.fullmatch(Path(path).stem)
    return int(match.group(1)) if match else None


_DUMP_NAME = re.compile(r"([0-9]{1,18})(?:_[0-9]{1,10})?")  # ASCII digits, an id under 10**18 < MAX_ID


def scan_file(path: str, flags: ScanFlags, load: dict) -> FileSummary:
    """Scan one file; a UserError becomes the summary's `error`."""
    from nanscope.dumps import checks, io  # heavy: numpy; the workers (the forkserver) import it, not the parent
    from nanscope.dumps.headroom import Headroom
    from nanscope.dumps.result import hazard_count

    t0 = time.perf_counter()
    try:
        dump = io.load(path, reward_key=flags.reward_key, **load)
        headroom = Headroom(dump.kind)
        result = checks.scan(dump, flags, observe=headroom.add)
    except UserError as e:
        return FileSummary(path, error=str(e), seconds=time.perf_counter() - t0)
    except Exception as e:  # one file's bug or MemoryError must not end the batch; it still fails the run
        text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return FileSummary(
            path,
            error=f"{path}: internal error: {type(e).__name__}: {text} (rerun this file alone with --debug)",
            seconds=time.perf_counter() - t0,
        )
    return FileSummary(
        path=path,
        error="",
        kind=result.dump_kind,
        rollout_id=result.rollout_id,
        rank=result.rank,
        num_samples=result.num_samples,
        response_tokens=result.response_tokens,
        would_nan=result.would_nan,
        mechanisms=result.mechanisms,
        counts={check.kind: check.count for check in result.checks if check.status == "ran"},
        total=hazard_count(result),
        errors=result.errors,
        seconds=time.perf_counter() - t0,
        format=result.format.release,
        headroom=headroom.result(),
    )


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
    check: Callable[[], None] | None = None,
) -> list[FileSummary]:
    """Scan `paths` on `workers` processes (default: the cores this process may use), in the paths' order.

    Args:
        done: called with each summary as its file finishes (in completion order).
        check: called every POLL_S; what it raises (a stop signal noted by the caller) ends the scan, the workers
            first.
    """
    load = dict(trust_pickle=trust_pickle, cp_size=cp_size, tp_size=tp_size, limits=limits or Limits())
    workers = min(workers or len(os.sched_getaffinity(0)), len(paths))
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(["nanscope.dumps.io", "nanscope.dumps.checks", "nanscope.dumps.headroom"])
    out: dict[str, FileSummary] = {}
    before = set(active_children())
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_setup)
    try:
        pending = {pool.submit(scan_file, str(p), flags, load) for p in paths}
        while pending:  # short waits: `check` sees a stop signal within POLL_S
            finished, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in finished:
                summary = future.result()
                out[summary.path] = summary
                if done is not None:
                    done(summary)
            if check is not None:
                check()
    except BaseException:  # a stop `check` raised, Ctrl-C, a broken pool: the workers end before it propagates
        manager = getattr(pool, "_executor_manager_thread", None)  # shutdown(wait=False) forgets it
        pool.shutdown(wait=False, cancel_futures=True)
        stop_workers([p for p in active_children() if p not in before])
        _join_manager(manager, MANAGER_GRACE_S)
        if check is not None:
            check()  # a stop signal that also ended a starting worker (Ctrl-C reaches the group) is the reason
        raise
    pool.shutdown(wait=True)
    return [out[str(p)] for p in paths]


def _join_manager(manager, timeout_s: float) -> None:
    """Wait (at most `timeout_s`) for the stopped pool's manager thread, which closes its wake-up pipe once it sees
    the workers gone.

    An exit while it still runs races it: CPython's exit hook for process pools (3.11's
    concurrent/futures/process.py:92-100, `_python_exit`; its `wakeup`, 82-84) writes to that pipe without the lock
    the manager holds to close it, and on a loaded machine prints `Exception ignored ... OSError: [Errno 9] Bad file descriptor` under the
    command's one line (CPython gh-125451: 3.12 and 3.13 took a lock for it in October 2024, 3.11 did not). Once
    the thread has ended, the hook's write is skipped. `manager` None (another Python's pool): nothing to wait for.
    """
    if manager is not None and manager is not threading.current_thread():
        manager.join(timeout_s)


def _worker_setup() -> None:
    """A worker leaves the stop signals to the parent: a terminal's Ctrl-C reaches the whole process group, and the
    parent, not each worker, decides what stops (it ends the workers itself, `stop_workers`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_workers(workers: list, grace_s: float = 5.0) -> None:
    """SIGTERM each worker process, then SIGKILL those still there after `grace_s`; each one joined (reaped)."""
    for worker in workers:
        worker.terminate()
    deadline = time.monotonic() + grace_s
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()
