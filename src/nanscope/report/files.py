"""Writing a command's outputs to user-named paths: refused before the work, then written whole or not at all.

check_outputs(outputs, inputs)  before the work: every target is new or a regular file in a writable directory,
                                named by one output only, and none of the files the run reads
write_text(path, text, flag)    HTML, terminal transcripts
write_json(path, doc, flag)     every command's --json
replacing(path, flag)           for a writer that takes a path (torch.save): the temporary path to write

Each write goes to a temporary file in the target's directory, renamed onto the target once complete: a failed
write leaves the old file as it was and no temporary file behind. A FIFO would block the write forever and
/dev/null would swallow it, so a target that exists must be a regular file; a symlink is followed (the file it
names is replaced, the link stays). Inputs are compared by their file (device and inode), so a symlink or a hard
link to one is refused as well. Every refusal is one UserError line naming the flag and the path (repr() of a
path that holds a newline or another unprintable character).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from nanscope.errors import UserError
from nanscope.inputs import shown

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_outputs(
    outputs: dict[str, str | os.PathLike | None],
    inputs: Iterable[tuple[str, str | os.PathLike | None]] = (),
    replace: bool = True,
    parents: bool = False,
) -> None:
    """Refuse, before any work, an output that could not be written or would destroy something.

    Args:
        outputs: flag -> target path (None: not asked for), e.g. {"--json": args.json, "--html": args.html}.
        inputs: (what, path) of every file the run reads, e.g. ("launch script", "run.sh"); None paths skipped.
        replace: an existing target may be replaced (False: `--write-demo` without `--force`).
        parents: the target's missing directories are created by the write (`--write-demo`).
    """
    read = {}
    for what, path in inputs:
        key = _file_key(path) if path is not None else None
        if key is not None:
            read.setdefault(key, (what, path))
    named: dict[tuple, tuple[str, str | os.PathLike]] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        if not os.fspath(path):
            raise UserError(f"{flag} '': an empty path (give a file name)")
        check_writable(path, flag, replace, parents)
        key = _file_key(path) or ("new", os.path.realpath(path))
        if key in read:
            what, source = read[key]
            same = "" if os.path.realpath(source) == os.path.realpath(path) else f" {shown(source)}"
            raise UserError(f"{flag} {shown(path)}: is this run's {what}{same}: writing it would destroy it")
        if key in named:
            other, first = named[key]
            raise UserError(f"{flag} {shown(path)}: names the same file as {other} {shown(first)}: give each its own")
        named[key] = (flag, path)


def check_writable(path: str | os.PathLike, flag: str = "--json", replace: bool = True, parents: bool = False) -> None:
    """One target: new or a regular file (replaceable unless `replace` is False), in a writable directory."""
    if _existing(path, flag) is not None and not replace:
        raise UserError(f"{flag} {shown(path)}: exists (pass --force to replace it)")
    if parents:
        return  # the write creates the directories; what stands in their way is refused then
    parent = _directory(path)
    if not parent.is_dir():
        raise UserError(f"{flag} {shown(path)}: no such directory: {shown(parent)}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {shown(path)}: directory not writable: {shown(parent)}")


@contextlib.contextmanager
def replacing(path: str | os.PathLike, flag: str, parents: bool = False) -> Iterator[str]:
    """A temporary file beside `path` to write; renamed onto `path` if the block ends without an error, removed
    if it raises. An OSError (the directory, the disk, the rename) is one UserError line naming flag and path."""
    existing = _existing(path, flag)  # again: a FIFO may have appeared since check_outputs
    target = os.path.realpath(path) if os.path.islink(path) else os.fspath(path)
    directory = os.path.dirname(target) or "."
    try:
        if parents:
            os.makedirs(directory, exist_ok=True)
        name = os.path.basename(target)[:200]  # the temporary name fits NAME_MAX where the target's does
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        os.close(fd)
    except OSError as e:
        raise _cannot_write(flag, path, e) from None
    try:
        yield temporary
        os.chmod(temporary, stat.S_IMODE(existing.st_mode) if existing is not None else 0o666 & ~_umask())
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())  # the data reaches the disk before the name does
        os.replace(temporary, target)
    except OSError as e:
        raise _cannot_write(flag, path, e) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def write_text(path: str | os.PathLike, text: str, flag: str = "--html") -> None:
    """Write `text` to `path` as UTF-8 (see `replacing`)."""
    with replacing(path, flag) as temporary:
        # backslashreplace: a lone surrogate (a file name's undecodable byte) must not lose the report
        with open(temporary, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)


def write_json(path: str | os.PathLike, doc, flag: str = "--json") -> None:
    """`doc` as indented JSON (NaN and inf as JSON's NaN/Infinity, as json.dump writes them)."""
    write_text(path, json.dumps(doc, indent=1) + "\n", flag)


def _existing(path: str | os.PathLike, flag: str) -> os.stat_result | None:
    """The stat of the file `path` names (symlinks followed), None if there is none; refused unless regular."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:  # a file where a directory should be, a symlink loop, a name too long
        raise _cannot_write(flag, path, e) from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{flag} {shown(path)}: is a directory, expected a file path")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a plain file")
        raise UserError(f"{flag} {shown(path)}: not a regular file ({kind}); outputs are written to regular files")
    if not os.access(path, os.W_OK):  # a read-only file is the user's "keep this": the rename would not ask
        raise UserError(f"{flag} {shown(path)}: file not writable")
    return st


def _directory(path: str | os.PathLike) -> Path:
    """The directory the target's file goes in: the path's own, or its symlink's target's."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    return target.parent if str(target.parent) else Path(".")


def _file_key(path: str | os.PathLike) -> tuple | None:
    """(device, inode) of the file `path` names, None if it names none (or cannot be looked at)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None
    return (st.st_dev, st.st_ino)


def _umask() -> int:
    """The process's umask: what a plain open() would have applied to a new file."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _cannot_write(flag: str, path: str | os.PathLike, e: OSError) -> UserError:
    return UserError(f"{flag} {shown(path)}: cannot write: {e.strerror or e}")
