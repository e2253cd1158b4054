"""User-named input files, checked before they are read: regular files only, with a size cap.

A FIFO would block the read forever and /dev/zero would fill memory, so a path is resolved
(symlinks followed) and must name a regular file no larger than `limit` bytes, outside the kernel's
file systems (/proc, /sys, /dev: /proc/kmsg passes as a regular file and blocks the read, /proc/self/mem
fails it; /dev/shm, plain memory-backed files, is read). Each refusal is one UserError line naming the
file and, for the cap, the limit and the option that raises it.

    read_bytes("launch.sh", "launch script", limit=MiB, option="--max-input-mb")
    read_json("report.json", "report", limit=MiB)   # bad JSON, too deep a nesting, a 5,000-digit int: one line
    fill_template("dumps/{rollout_id:04d}.pt", "--rollout", rollout_id=12)   # "dumps/0012.pt"
    printable("a\nb")   # "a\\nb": a file's text on a terminal, one line, no escape sequences
    found, skipped = directory_files("dumps/", "*.pt", recursive=True)   # and what was named so but not read
"""

from __future__ import annotations

import json
import os
import re
import stat
import string
from pathlib import Path

from nanscope.errors import UserError

MiB = 1 << 20
KERNEL_FILE_SYSTEMS = ("/proc", "/sys", "/dev")  # files there may block or fail a read, whatever their mode
READABLE_UNDER_DEV = ("/dev/shm",)  # tmpfs: plain files in memory
MAX_TEMPLATE_WIDTH = 64  # the widest format spec a path template may ask for ({rollout_id:04d} asks for 4)
_SPEC = re.compile(r"(?:.?[<>=^])?[+ -]?0?(?P<width>\d{1,3})?d?")  # [[fill]align][sign][0][width][d]


def check_file(path: str | os.PathLike, what: str, limit: int | None = None, option: str | None = None) -> int:
    """Check that `path` is a regular file of at most `limit` bytes; returns its size.

    Raises:
        UserError: missing, a directory, a FIFO/device/socket, in a kernel file system, or over the limit.
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
        raise UserError(f"{path}: {what}: not a regular file ({file_kind(st.st_mode)})")
    kernel = kernel_file_system(path)
    if kernel is not None:
        real = os.path.realpath(path)
        where = f"resolves to {real}, " if real != os.path.abspath(path) else ""
        raise UserError(
            f"{path}: {what}: {where}in {kernel}, a kernel file system whose reads can block or fail: not read "
            "(copy the file elsewhere first)"
        )
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


def read_json(path: str | os.PathLike, what: str, limit: int | None = None, option: str | None = None):
    """`read_text` parsed as JSON; whatever the file holds is one UserError line (JSON's syntax errors, a nesting
    deeper than Python's recursion limit, an integer past its 4,300-digit conversion limit)."""
    text = read_text(path, what, limit, option)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: {what}: not valid JSON: {e.msg} at line {e.lineno}") from None
    except RecursionError:
        raise UserError(f"{path}: {what}: not valid JSON: nested too deeply") from None
    except ValueError as e:  # an integer past Python's 4,300-digit conversion limit
        raise UserError(f"{path}: {what}: not valid JSON: {str(e).split(':')[0]}") from None


def directory_files(
    root: str | os.PathLike, pattern: str, recursive: bool = False
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The regular files in `root` (and below, `recursive`) whose names match `pattern` (a glob, "*.pt"), sorted;
    and, sorted too, each entry named so that is no regular file, with what it is: a FIFO, a device, a directory, a
    link to one of those or to nothing. Links to regular files are files; linked directories are not walked.

    Raises:
        UserError: `root` is not a directory, or lies in a kernel file system (/proc's entries come and go).
    """
    kernel = kernel_file_system(root)
    if kernel is not None:
        raise UserError(f"{root}: in {kernel}, a kernel file system whose reads can block or fail: not read")
    if not os.path.isdir(root):
        raise UserError(f"{root}: not a directory")
    found, skipped = [], []
    for path in sorted(Path(root).rglob(pattern) if recursive else Path(root).glob(pattern)):
        what = _entry(path)
        if what is None:
            found.append(path)
        else:
            skipped.append((path, what))
    return found, skipped


def skipped_lines(skipped: list[tuple[Path, str]], shown_at_most: int = 5) -> list[str]:
    """One line per entry `directory_files` skipped (at most `shown_at_most`, then how many more), printable."""
    lines = [printable(f"skipped {path}: {what}, not a regular file") for path, what in skipped[:shown_at_most]]
    more = len(skipped) - shown_at_most
    return lines + ([f"skipped {more} more entries that are not regular files"] if more > 0 else [])


def _entry(path: Path) -> str | None:
    """None for a regular file (or a link to one); else what the entry is."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a dangling link" if os.path.islink(path) else "gone"
    except OSError as e:  # a link loop, a name too long, no permission
        return f"unreadable: {e.strerror or e}"
    link = "a link to " if os.path.islink(path) else ""
    if stat.S_ISREG(st.st_mode):
        return None
    return f"{link}{'a directory' if stat.S_ISDIR(st.st_mode) else file_kind(st.st_mode)}"


def kernel_file_system(path: str | os.PathLike) -> str | None:
    """The kernel file system ("/proc", "/sys", "/dev") that `path` resolves into (symlinks followed), else None."""
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root + "/") for root in READABLE_UNDER_DEV):
        return None
    return next((root for root in KERNEL_FILE_SYSTEMS if real == root or real.startswith(root + "/")), None)


def fill_template(template: str, what: str, **values: int) -> str:
    """A path template as slime fills it (`str.format`, e.g. --save-debug-rollout-data `dumps/{rollout_id}.pt`),
    with only the fields in `values` and integer format specs of width <= MAX_TEMPLATE_WIDTH ({rollout_id:04d}).

    Raises:
        UserError: one line naming `what` and the field: another name ({0}, {rollout_id.real}, {x}), a
            conversion (!r), a wider or another spec ({rollout_id:>3000000000} would allocate gigabytes).
    """
    out = []
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:  # a lone brace
        raise UserError(f"{what} {template!r:.200}: not a path template: {e}") from None
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        if name not in values or conversion is not None:
            field = name[:40] + (f"!{conversion}" if conversion else "")
            known = ", ".join("{" + k + "}" for k in values)
            raise UserError(f"{what} {template!r:.200}: {{{field}}}: a path template fills only {known}")
        match = _SPEC.fullmatch(spec)
        if match is None or int(match["width"] or 0) > MAX_TEMPLATE_WIDTH:
            raise UserError(
                f"{what} {template!r:.200}: {{{name}:{spec[:40]}}}: expected an integer format of width <= "
                f"{MAX_TEMPLATE_WIDTH}, e.g. {{{name}:04d}}"
            )
        out.append(format(values[name], spec))
    return "".join(out)


def printable(text: str) -> str:
    """`text` with each unprintable character (a newline, an ANSI escape, a carriage return) as repr() writes it:
    what a file holds, shown on a terminal, can neither forge a line nor retitle, clear or recolour it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown(path: str | os.PathLike) -> str:
    """`path` as an error line shows it: as it is, or repr() of it if that is needed to keep the line one line."""
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, as a refusal names it ("a FIFO", "a character device")."""
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
