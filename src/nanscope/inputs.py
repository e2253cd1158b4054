"""User-named input files, checked before they are read: regular files only, with a size cap.

A FIFO would block the read forever and /dev/zero would fill memory, so a path is resolved
(symlinks followed) and must name a regular file no larger than `limit` bytes. Each refusal is one
UserError line naming the file and, for the cap, the limit and the option that raises it.

    read_bytes("launch.sh", "launch script", limit=MiB, option="--max-input-mb")
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nanscope.errors import UserError

MiB = 1 << 20


def check_file(path: str | os.PathLike, what: str, limit: int | None = None, option: str | None = None) -> int:
    """Check that `path` is a regular file of at most `limit` bytes; returns its size.

    Raises:
        UserError: missing, a directory, a FIFO/device/socket, or over the limit.
    """
    try:
        st = os.stat(path)  # follows symlinks: a link to /dev/zero is refused as a device
    except FileNotFoundError:
        raise UserError(f"{path}: {what}: no such file") from None
    except OSError as e:
        raise UserError(f"{path}: {what}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path}: {what}: is a directory, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: {what}: not a regular file ({_kind(st.st_mode)})")
    if limit is not None and st.st_size > limit:
        raise UserError(
            f"{path}: {what}: {_size(st.st_size)} is over the {_size(limit)} limit"
            + (f" (raise it with {option})" if option else "")
        )
    return st.st_size


def read_bytes(path: str | os.PathLike, what: str, limit: int | None = None, option: str | None = None) -> bytes:
    """`check_file`, then the file's bytes (an OSError on the read is one UserError line too)."""
    check_file(path, what, limit, option)
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"{path}: {what}: cannot read: {e.strerror or e}") from None


def read_text(path: str | os.PathLike, what: str, limit: int | None = None, option: str | None = None) -> str:
    """`read_bytes` decoded as UTF-8 (undecodable bytes replaced)."""
    return read_bytes(path, what, limit, option).decode("utf-8", errors="replace")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"
