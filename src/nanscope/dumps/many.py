"""Scanning every dump under a directory, files in parallel on the available cores, one summary each.

Each file is scanned in a worker process (a forkserver that has imported the reader and the checks once),
so a slow or large file does not hold the others and a file's memory is returned when it is done. A file
that cannot be read is a summary with its one-line error, not the end of the batch.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING

from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.limits import Limits
from nanscope.errors import UserError

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


def find_dumps(directory: str | Path) -> list[Path]:
    """The *.pt files under `directory` (recursively), sorted; a directory without any is a UserError."""
    paths = sorted(p for p in Path(directory).rglob("*.pt") if p.is_file())
    if not paths:
        raise UserError(f"{directory}: no *.pt dumps in this directory or below")
    return paths


def name_rollout(path: str | Path) -> int | None:
    """The rollout a dump's file name gives, as slime names them ({rollout_id}.pt, {rollout_id}_{rank}.pt), else
    None."""
    match = _DUMP_NAME.fullmatch(Path(path).stem)
    return int(match.group(1)) if match else None


_DUMP_NAME = re.compile(r"(\d+)(?:_\d+)?")


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
) -> list[FileSummary]:
    """Scan `paths` on `workers` processes (default: the cores this process may use), in the paths' order.

    Args:
        done: called with each summary as its file finishes (in completion order).
    """
    load = dict(trust_pickle=trust_pickle, cp_size=cp_size, tp_size=tp_size, limits=limits or Limits())
    workers = min(workers or len(os.sched_getaffinity(0)), len(paths))
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(["nanscope.dumps.io", "nanscope.dumps.checks", "nanscope.dumps.headroom"])
    out: dict[str, FileSummary] = {}
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = [pool.submit(scan_file, str(p), flags, load) for p in paths]
        for future in as_completed(futures):
            summary = future.result()
            out[summary.path] = summary
            if done is not None:
                done(summary)
    return [out[str(p)] for p in paths]
