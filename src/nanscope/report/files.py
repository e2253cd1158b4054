"""Writing a command's outputs to user-named paths: refused before the work, then written whole or not at all.

check_outputs(outputs, inputs)  before the work: every target is new or a regular file in a writable directory,
                                named by one output only, and none of the files the run reads
write_text(path, text, flag)    HTML, terminal transcripts
write_json(path, doc, flag)     every command's --json
write_bytes(path, data, flag)   --write-demo's dumps, serialised in memory first
replacing(path, flag)           for a writer that takes a path: the temporary path to write

The writing itself is `nanscope.outputs` (the plugin's reports use it too): a temporary file in the target's
directory, renamed onto the target once complete, so a failed write leaves the old file as it was and no temporary
file behind. A FIFO would block the write forever and /dev/null would swallow it, so a target that exists must be a
regular file; a symlink is refused, dangling or not, and so is a path through a directory that is a symlink
(`linkdir/x.json`; those in `/` or a system tree, /bin -> usr/bin, are the system's, followed): no output is
written through one. Inputs
are compared by their file (device and inode), so a hard link to one is refused as well. Every refusal is one
UserError line naming the flag and the path (repr() of a path that holds a newline or another unprintable
character); a link's names where it points (`through_link`, the one wording).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from nanscope.errors import UserError
from nanscope.inputs import file_kind, shown
from nanscope.outputs import linked_directory, system_directory
from nanscope.outputs import replacing as replacing_whole

NEVER_THROUGH = "outputs are never written through one"


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
        key = _file_key(path) or ("new", os.path.realpath(path))
        if key in read:  # first: a link to an input is refused as the input it names
            what, source = read[key]
            same = "" if os.path.realpath(source) == os.path.realpath(path) else f" {shown(source)}"
            raise UserError(f"{flag} {shown(path)}: is this run's {what}{same}: writing it would destroy it")
        if key in named:
            other, first = named[key]
            raise UserError(f"{flag} {shown(path)}: names the same file as {other} {shown(first)}: give each its own")
        check_writable(path, flag, replace, parents)
        named[key] = (flag, path)


def check_writable(path: str | os.PathLike, flag: str = "--json", replace: bool = True, parents: bool = False) -> None:
    """One target: new or a regular file (replaceable unless `replace` is False), in a writable directory."""
    _check_directories(path, flag)
    if _existing(path, flag) is not None and not replace:
        raise UserError(f"{flag} {shown(path)}: exists (pass --force to replace it)")
    if parents:
        return  # the write creates the directories; what stands in their way is refused then
    parent = _directory(path)
    if not parent.is_dir():
        raise UserError(f"{flag} {shown(path)}: no such directory: {shown(parent)}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {shown(path)}: directory not writable: {shown(parent)}")


def check_directory(path: str | os.PathLike, flag: str = "--report-dir") -> None:
    """A directory a run leaves its files in (`repro --plugin --report-dir`): an existing directory, or one the run
    can make, writable, and none of the system's (`nanscope.outputs.system_directory`)."""
    problem = system_directory(path)
    if problem:
        raise UserError(f"{flag} {shown(path)}: {problem}: give a directory of the run's own")
    target = Path(path)
    try:
        if target.exists() and not target.is_dir():
            kind = "" if target.is_file() else f" ({file_kind(os.stat(target).st_mode)})"
            raise UserError(f"{flag} {shown(path)}: not a directory{kind}")
    except OSError as e:  # a symlink loop, a name too long
        raise _cannot_write(flag, path, e) from None
    parent = next((p for p in (target.absolute(), *target.absolute().parents) if p.exists()), Path("/"))
    if not parent.is_dir():
        raise UserError(f"{flag} {shown(path)}: not a directory: {shown(parent)} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {shown(path)}: directory not writable: {shown(parent)}")


@contextlib.contextmanager
def replacing(path: str | os.PathLike, flag: str, parents: bool = False) -> Iterator[str]:
    """A temporary file beside `path` to write; renamed onto `path` if the block ends without an error, removed
    (with the directories `parents` made) if it raises. An OSError (the directory, the disk, the rename) is one
    UserError line naming flag and path."""
    _check_directories(path, flag)  # again: a FIFO or a link may have appeared since check_outputs
    _existing(path, flag)
    try:
        with replacing_whole(path, parents=parents) as temporary:
            yield temporary
    except OSError as e:
        raise _cannot_write(flag, path, e) from None


def write_text(path: str | os.PathLike, text: str, flag: str = "--html") -> None:
    """Write `text` to `path` as UTF-8 (see `replacing`)."""
    with replacing(path, flag) as temporary:
        # backslashreplace: a lone surrogate (a file name's undecodable byte) must not lose the report
        with open(temporary, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes, flag: str, parents: bool = False) -> None:
    """`data` as the file at `path` (see `replacing`)."""
    with replacing(path, flag, parents) as temporary, open(temporary, "wb") as f:
        f.write(data)


def write_json(path: str | os.PathLike, doc, flag: str = "--json") -> None:
    """`doc` as indented JSON (NaN and inf as JSON's NaN/Infinity, as json.dump writes them)."""
    write_text(path, json.dumps(doc, indent=1) + "\n", flag)


def _existing(path: str | os.PathLike, flag: str) -> os.stat_result | None:
    """The stat of the file at `path` (a link not followed), None if there is none; refused unless regular."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:  # a file where a directory should be, a symlink loop above it, a name too long
        raise _cannot_write(flag, path, e) from None
    if stat.S_ISLNK(st.st_mode):
        raise through_link(flag, path)
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{flag} {shown(path)}: is a directory, expected a file path")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(
            f"{flag} {shown(path)}: not a regular file ({file_kind(st.st_mode)}); outputs are written to regular files"
        )
    if not os.access(path, os.W_OK):  # a read-only file is the user's "keep this": the rename would not ask
        raise UserError(f"{flag} {shown(path)}: file not writable")
    return st


def through_link(flag: str, path: str | os.PathLike, link: str | os.PathLike | None = None, fix: str = "") -> UserError:
    """The one refusal of an output a symbolic link would redirect: `path` itself a link (`link` None), or `link`, a
    directory on the way to it; `fix` what to do instead (default: name the file itself, or pass the resolved path)."""
    if link is None:
        what = f"is a symbolic link (to {shown(os.readlink(path))})"
        fix = fix or "name the file itself, or remove the link"
    else:
        what = f"{shown(link)} is a symbolic link (to {shown(os.readlink(link))})"
        fix = fix or f"pass the resolved path, {shown(_resolved(path))}"
    return UserError(f"{flag} {shown(path)}: {what}; {NEVER_THROUGH}: {fix}")


def _check_directories(path: str | os.PathLike, flag: str) -> None:
    """Refuse a target whose directories, as given, go through a user's symlink (`outputs.linked_directory`)."""
    link = linked_directory(path)
    if link is not None:
        raise through_link(flag, path, link)


def _resolved(path: str | os.PathLike) -> str:
    """`path` with its directories' links resolved (its own name kept)."""
    head, name = os.path.split(os.fspath(path))
    return os.path.join(os.path.realpath(head or "."), name)


def _directory(path: str | os.PathLike) -> Path:
    """The directory the target's file goes in."""
    parent = Path(path).parent
    return parent if str(parent) else Path(".")


def _file_key(path: str | os.PathLike) -> tuple | None:
    """(device, inode) of the file `path` names, None if it names none (or cannot be looked at)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None
    return (st.st_dev, st.st_ino)


def _cannot_write(flag: str, path: str | os.PathLike, e: OSError) -> UserError:
    return UserError(f"{flag} {shown(path)}: cannot write: {e.strerror or e}")
