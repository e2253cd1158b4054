"""Files nanscope writes, written whole and never through a link: the one writer under every output.

    with replacing("scan.json") as temporary: ...       # write `temporary`; it is renamed onto scan.json
    write_bytes("rollout0_step1_rank0.json", data)      # the same, for bytes in hand
    copy_file("work/train.as-is.out", "reports/train.as-is.out")
    system_directory("/etc/cron.d")                     # why a directory is the system's own, else None
    linked_directory("linkdir/x.json")                  # "linkdir" when it is a user's symlink, else None

A write goes to a new temporary file in the target's directory (created exclusively, so never an existing file or
a link), is made durable (fsync) and renamed onto the target's own name. A rename replaces a link at that name and
never touches what the link points to: no output is written through a symlink, dangling or not. A reader never
sees half a file; a failed write (a full disk, a directory at the name, a refused rename) leaves the old file as it
was, no temporary file, and none of the directories the write made. Failures are the OSError they were; the
command-line wrapper (`nanscope.report.files`) and the plugin (`nanscope.slime_plugin.outputs`) word them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

# Directories no output goes in, nor anything below them: the system's own, and the kernel's (/dev/shm, a tmpfs,
# excepted). /lib, /bin and /sbin are links into /usr on merged-/usr systems: both spellings are covered.
SYSTEM_TREES = ("/etc", "/usr", "/bin", "/sbin", "/boot", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sys",
                "/dev", "/var/spool", "/var/lib", "/snap")  # fmt: skip
WRITABLE_UNDER_SYSTEM = ("/dev/shm",)
# A directory of credentials or login state, wherever it is (~/.ssh, /root/.ssh, a mounted home's .aws).
SECRET_DIRECTORIES = (".ssh", ".gnupg", ".aws", ".kube", ".docker", ".config/autostart")


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, parents: bool = False, mode: int | None = None) -> Iterator[str]:
    """A new temporary file beside `path`, renamed onto `path` if the block ends without an error.

    Args:
        parents: make `path`'s missing directories first (removed again if the write fails).
        mode: the file's permission bits (default: an existing regular file's, else 0o666 less the umask).

    Raises:
        OSError: the directory, the disk or the rename failed; nothing is left behind.
    """
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    made = make_directories(directory) if parents else []
    temporary = None
    try:
        name = os.path.basename(target)[:200]  # the temporary name fits NAME_MAX where the target's does
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        os.close(fd)
        yield temporary
        os.chmod(temporary, _mode(target) if mode is None else mode)
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())  # the data reaches the disk before the name does
        os.replace(temporary, target)  # a link at `target` is replaced, never followed
    except BaseException:
        if temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        remove_directories(made)
        raise


def write_bytes(path: str | os.PathLike, data: bytes, *, parents: bool = False) -> None:
    """`data` as the file at `path` (see `replacing`)."""
    with replacing(path, parents=parents) as temporary, open(temporary, "wb") as f:
        f.write(data)


def copy_file(source: str | os.PathLike, path: str | os.PathLike) -> None:
    """A copy of the regular file `source` as the file at `path` (see `replacing`)."""
    with replacing(path) as temporary:
        shutil.copyfile(source, temporary)


def make_directories(directory: str | os.PathLike) -> list[str]:
    """`os.makedirs(directory)`; returns the directories it made, deepest first (for `remove_directories`)."""
    made, todo = [], os.path.abspath(directory)
    while not os.path.lexists(todo):
        made.append(todo)
        todo = os.path.dirname(todo)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:  # a file in the way, a full disk: what was made so far goes again
        remove_directories(made)
        raise
    return made


def remove_directories(made: list[str]) -> None:
    """Remove what `make_directories` made, deepest first, where still empty."""
    for directory in made:
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def link_in(path: str | os.PathLike, root: str | os.PathLike) -> str | None:
    """The first symlink among `path` and its directories up to `root` (excluded), else None: what a write under
    `root` would go through (`--demo-kind run`'s rollout_data/ and train_data/)."""
    here, stop = os.path.abspath(path), os.path.abspath(root)
    while here != stop and here != os.path.dirname(here):
        if os.path.islink(here):
            return here
        here = os.path.dirname(here)
    return None


def linked_directory(path: str | os.PathLike) -> str | None:
    """The first of `path`'s directories, as written (relative or absolute), that is a symlink outside the system's
    own places, else None: a write to `path` would land where that link points. A link in `/` or in a system tree
    (merged /usr's /bin -> usr/bin, /var/run -> /run, a cluster's /scratch -> /lustre/scratch) is followed as ever;
    a link anywhere else is refused whoever made it (as root, every link is root's: ownership tells nothing)."""
    text = os.fspath(path)
    here = ""
    for i, part in enumerate(text.split("/")[:-1]):
        here = "/" if i == 0 and part == "" else os.path.join(here, part)
        if part in ("", "."):
            continue
        try:
            st = os.lstat(here)
        except (OSError, ValueError):  # missing (the write makes real directories), a NUL byte: no link to follow
            return None
        parent = os.path.dirname(os.path.abspath(here))
        if stat.S_ISLNK(st.st_mode) and parent != "/" and not _under(parent, SYSTEM_TREES + ("/var",)):
            return here
    return None


def system_directory(path: str | os.PathLike) -> str | None:
    """Why `path` is no place for a run's files (a system directory, a kernel file system, a directory of
    credentials; as given or as it resolves), else None."""
    given, resolved = os.path.abspath(path), os.path.realpath(path)
    for where in dict.fromkeys((given, resolved)):
        if where == "/" or (_under(where, SYSTEM_TREES) and not _under(where, WRITABLE_UNDER_SYSTEM)):
            return f"resolves to {resolved}, a system directory"
        secret = next((s for s in SECRET_DIRECTORIES if f"/{s}/" in where + "/"), None)
        if secret is not None:
            return f"resolves to {resolved}, inside a {secret} directory (credentials)"
    return None


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _mode(target: str) -> int:
    """The permission bits a replacement keeps: the existing regular file's, else what open() would give."""
    with contextlib.suppress(OSError):
        st = os.lstat(target)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read where Linux shows it (setting it to read it back would change it for every thread
    of a training run for that moment)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
