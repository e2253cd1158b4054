"""A launch's temp dirs, marked with the process that owns them, removed by whoever notices it is gone.

    with scratch.directory("nanscope-run-") as path:   # tempfile.TemporaryDirectory, plus an owner mark
        ...
    scratch.sweep()                                     # remove the marked nanscope-* dirs whose owner is gone

A clean exit or a stop signal removes a directory as TemporaryDirectory does. SIGKILL of the owner cannot
be caught: then the launch's agent, which watches its parent (`proctree.ParentWatch`), kills the ranks and
sweeps; and should the agent die with it, the next launch's sweep removes them. The owner is a process
identity, not a bare pid: pid, start time (a reused pid has another) and pid namespace. A directory is
removed only when its mark names a process that is gone (exited, a zombie, or another process under its
pid) in this pid namespace. Unmarked or unreadable marks, other users' directories and symlinks are never
touched, so a live run's directories are never removed, whatever its version.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "nanscope-"
MARK = ".nanscope-owner"  # {"pid", "start", "pidns"} of the owning process
MAX_MARK_BYTES = 4096


def identity(pid: int) -> dict | None:
    """{"pid", "start", "pidns"} of a process, None when it is gone or a zombie (or without /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":  # exited: only its parent's wait is missing
        return None
    return {"pid": pid, "start": int(fields[19]), "pidns": _pidns()}  # stat field 22: start time in ticks


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def mark(path: str | os.PathLike) -> None:
    """Mark `path` as owned by this process (nothing without /proc: such a directory is never swept)."""
    me = identity(os.getpid())
    if me is not None:
        (Path(path) / MARK).write_text(json.dumps(me))


@contextlib.contextmanager
def directory(prefix: str) -> Iterator[str]:
    """A temp dir named `prefix`..., marked as this process's, removed on exit (tempfile.TemporaryDirectory)."""
    assert prefix.startswith(PREFIX), prefix
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        mark(path)
        yield path


def owner_gone(path: str | os.PathLike) -> bool:
    """The mark in `path` names a process that is gone; False when unmarked, unreadable or not ours to judge."""
    try:
        fd = os.open(Path(path) / MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return False
        text = f.read(MAX_MARK_BYTES + 1)
    if len(text) > MAX_MARK_BYTES:
        return False
    try:
        owner = json.loads(text)
        pid, start, pidns = int(owner["pid"]), int(owner["start"]), str(owner["pidns"])
    except (ValueError, TypeError, KeyError):
        return False
    if pidns != _pidns():  # another pid namespace: its pids are not ours to look up
        return False
    now = identity(pid)
    return now is None or now["start"] != start


def sweep(root: str | os.PathLike | None = None) -> list[str]:
    """Remove the marked `nanscope-*` dirs directly under `root` (default: the temp dir) whose owner is gone.

    Returns the paths removed.
    """
    root = Path(root if root is not None else tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
        if entry.name.startswith(PREFIX) and mine and owner_gone(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed
