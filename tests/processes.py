"""What each process of a launch received: a watch of a process's descendants, read from /proc while they live.

    with ProcessWatch(os.getpid()) as watch:
        launcher.launch(...)
    for seen in watch.seen.values():
        assert seen.environ["CUDA_VISIBLE_DEVICES"] == ""

A thread polls the descendants of `root` every `poll_s`; for each process it records the variables of
`hidden_cuda.NAMES` in /proc/PID/environ (the environment the process was started with: for a process forked
without exec, the one its parent was started with) and, at every poll, its command line (Ray's workers rename
themselves), whether it maps the CUDA driver (libcuda.so) and whether it holds /dev/nvidia-uvm open, which the driver's
initialisation opens. A process that lives shorter than a poll may be missed: the checks count the ones they need.

The environment is the one of the program the process runs: read again at each poll, the last read kept (a process
caught between its fork and its exec, or inside the exec, shows its parent's or a half-made one; the next poll reads
its own). The CI saw both: Popen's torchrun before its exec, Ray's DashboardAgent at load 7 with its variables half
there (tests/megatron/test_harness.py and tests/slime_releases/test_slime_train.py each failed so once; polling
without a pause caught 29 of 40 launches of a child before its exec).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

from nanscope.megatron import hidden_cuda, proctree

UNSET = None  # a variable the process's environment does not hold


RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # Ray's own service processes


@dataclasses.dataclass
class Seen:
    pid: int
    environ: dict  # name -> value, or UNSET, for hidden_cuda.NAMES
    cmdline: str = ""
    cuda_driver: bool = False  # libcuda.so mapped, or /dev/nvidia-uvm open, at any poll
    forked: bool = False  # at the last read still running its parent's program (a fork, not exec'd)


def environ(pid: int) -> dict | None:
    """hidden_cuda.NAMES in /proc/PID/environ (None: the process is gone, not readable, or in the middle of exec).

    An empty environ is not a process started with no variables: it is one caught inside execve, after the kernel
    installed the new image's memory and before it copied the environment there (mm->env_end still 0), or a zombie.
    CI saw Ray's RuntimeEnvAgent so, between its fork from the raylet and its exec; the next poll reads it whole.
    """
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    if not raw:
        return None
    pairs = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {name: (pairs[name.encode()].decode() if name.encode() in pairs else UNSET) for name in hidden_cuda.NAMES}


def cuda_driver(pid: int) -> bool:
    """The process has the CUDA driver loaded (libcuda.so in its maps) or initialised (/dev/nvidia-uvm open)."""
    try:
        if "libcuda.so" in Path(f"/proc/{pid}/maps").read_text(errors="replace"):
            return True
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/nvidia-uvm":
                return True
        except OSError:
            continue
    return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class ProcessWatch:
    """Records every descendant `root` starts while the block runs (and `root` itself with `include_root`); `seen`:
    pid -> Seen. Those alive when the block starts, and what they start, are not its business (a test process's
    earlier children, TorchInductor's compile workers) and are left out."""

    def __init__(self, root: int, poll_s: float = 0.25, include_root: bool = False):
        self.root, self.poll_s, self.include_root = root, poll_s, include_root
        self.seen: dict[int, Seen] = {}
        self._before: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-watch", daemon=True)

    def __enter__(self) -> ProcessWatch:
        self._before = set(self._descendants())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.poll_s)
        self.poll()

    def _descendants(self, tree: dict[int, list[int]] | None = None) -> list[int]:
        """`root`'s descendants now, but for the subtrees of those alive when the block started."""
        tree = proctree.children() if tree is None else tree
        todo, pids = [p for p in tree.get(self.root, []) if p not in self._before], []
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo.extend(tree.get(pid, []))
        return pids

    def poll(self) -> None:
        tree = proctree.children()
        parents = {child: parent for parent, children in tree.items() for child in children}
        pids = self._descendants(tree) + ([self.root] if self.include_root else [])
        for pid in pids:
            seen = self.seen.get(pid)
            line = cmdline(pid)
            env = environ(pid)  # read at every poll, the last read kept: a process's own program's, once it runs
            if env is None and seen is None:
                continue
            forked = bool(line) and pid in parents and line == cmdline(parents[pid])
            if seen is None:
                seen = self.seen[pid] = Seen(pid, env, forked=forked)
            elif env is not None:
                seen.environ, seen.forked = env, forked
            seen.cmdline = line or seen.cmdline
            seen.cuda_driver = seen.cuda_driver or cuda_driver(pid)

    def ours(self) -> list[Seen]:
        """The processes whose environment the launch sets: all but Ray's own agents, which the raylet starts with an
        environment it builds itself (read after their exec, DashboardAgent and RuntimeEnvAgent lack some of the
        launch's variables); their CUDA driver is still checked by the callers, over `seen`."""
        return [seen for seen in self.seen.values() if not seen.cmdline.startswith(RAY_AGENTS)]

    def matching(self, text: str) -> list[Seen]:
        """The processes whose command line (their last seen) holds `text`."""
        return [seen for seen in self.seen.values() if text in seen.cmdline]
