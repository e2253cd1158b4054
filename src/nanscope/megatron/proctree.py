"""A launch's processes: stop signals noted instead of obeyed, the whole torchrun tree killed (Linux /proc),
and an agent that ends with its parent.

torchrun runs in its own session (a Ctrl-C in the terminal does not reach it) and its ranks may start
new sessions of their own, so neither the terminal nor a process-group kill ends them: the parent
collects the tree from /proc and kills it pid by pid. A tree's root that runs a user's code (slime's
train.py) first adopts its orphans (`adopt_orphans`): a process that detaches stays in the tree. A parent killed by SIGKILL does none of this: its
agent notices (`ParentWatch`), kills the ranks and removes the launch's temp dirs itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

POLL_S = 0.25  # how often a running tree's parent looks for a stop signal
# The signals that end `nanscope repro` (exit 128 + signal number: 130, 143, 129).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PARENT_GONE_EXIT = 128 + signal.SIGKILL  # a launch's agent whose parent was killed ends as if killed too


class Interrupted(BaseException):
    """A stop signal arrived during a launch; its process tree is gone when this is raised.

    A BaseException, like KeyboardInterrupt: not an error of the run, so `except Exception` lets it pass.
    """

    def __init__(self, signum: int, workers: int):
        super().__init__(f"{signal.Signals(signum).name}: {workers} workers stopped")
        self.signum, self.workers = signum, workers

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignals:
    """Within `with StopSignals() as stop:`, SIGINT/SIGTERM/SIGHUP only set `stop.signum` (the first one).

    On leaving, a handler the caller had installed for that signal (a Python function, not Python's default
    SIGINT handler) receives it once: a program that embeds a launch is told to stop as well.

    The caller polls it at points where it can clean up. Outside the main thread (where Python
    cannot set handlers) nothing is changed and `signum` stays None; so are ignored signals.
    """

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def _note(self, signum, _frame) -> None:
        self.signum = self.signum or signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            # A signal the user chose to ignore (nohup: SIGHUP) stays ignored.
            mine = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
            self._previous = {s: signal.signal(s, self._note) for s in mine}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        previous = self._previous.get(self.signum)
        if callable(previous) and previous is not signal.default_int_handler:
            # the program around the launch had its own handler (a test runner's): it gets the signal too, now
            # that the launch's processes are gone; the CLI's are the defaults, and its exit code says it
            signal.raise_signal(self.signum)

    def check(self, workers: int = 0) -> None:
        """Raise Interrupted if a stop signal arrived (`workers`: how many processes were stopped)."""
        if self.signum is not None:
            raise Interrupted(self.signum, workers)


PR_SET_CHILD_SUBREAPER = 36  # prctl(2), Linux >= 3.4


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants (Linux prctl PR_SET_CHILD_SUBREAPER): a descendant that
    detaches (forks and lets its parent exit, as a daemon does) is re-parented to this process, not to init, so it
    stays in this process's tree and `kill_tree` reaches it. False where the kernel offers no such thing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc (empty without /proc: then only the root is signalled)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants, parents before children."""
    tree, out, todo = children(), [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_tree(pid: int, *, root: bool = True) -> list[int]:
    """SIGKILL `pid` (unless `root` is False: a process ending its own descendants) and all its descendants.

    Returns the pids signalled, parents first. The tree is frozen first (SIGSTOP, repeated until no new
    descendant appears), so a process that forks while the tree is being read is caught too.
    """
    seen: list[int] = [] if root else [pid]
    while new := [p for p in _tree(pid) if p not in seen]:
        for p in new:
            _signal(p, signal.SIGSTOP)
        seen += new
    seen = seen if root else seen[1:]
    for p in seen:
        _signal(p, signal.SIGKILL)
    return seen


def run_tree(cmd: list[str], *, env: dict, timeout_s: float, stop: StopSignals) -> tuple[int | None, bool, str]:
    """Run `cmd` in a session of its own, stdout and stderr captured together; returns (exit code, timed out, output).

    Its whole tree is killed after `timeout_s`, or at once when `stop` notes a stop signal (then Interrupted is
    raised, once the tree is gone).
    """
    stop.check()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + max(1.0, timeout_s)
    while True:
        try:  # short waits: a stop signal is acted on within POLL_S
            output, _ = proc.communicate(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
            return proc.returncode, False, output.decode(errors="replace")
        except subprocess.TimeoutExpired:
            if stop.signum is not None:
                pids = kill_tree(proc.pid)
                proc.wait()
                proc.stdout.close()
                wait_gone(pids[1:])
                stop.check(workers=len(pids) - 1)
            if time.monotonic() >= deadline:
                break
    pids = kill_tree(proc.pid)
    try:
        output, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # a descendant we could not see still holds the pipe
        proc.kill()
        output = b"(output lost: the process tree did not exit after SIGKILL)"
    wait_gone(pids[1:])
    return proc.returncode, True, output.decode(errors="replace")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has exited; only its parent's wait is missing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """Wait until none of `pids` is alive; returns those still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


class ParentWatch:
    """Ends this process and its descendants when its parent dies, even by SIGKILL, then runs `cleanup`.

        watch = ParentWatch(parent_pid, cleanup=lambda: scratch.sweep(root))
        ...
        watch.exit(code)   # instead of os._exit(code): never while the watch is cleaning up

    A daemon thread polls getppid() every `poll_s`: a dead parent's children are re-parented (to init or
    a subreaper). Without Linux's PR_SET_PDEATHSIG on this process, so that there is time to kill the
    descendants first and then remove what they were writing to. `parent` is the pid the parent had when
    it started this process: a parent that died before the watch started is noticed at the first poll.
    """

    def __init__(self, parent: int, cleanup, poll_s: float = 0.2):
        self.parent, self.cleanup, self.poll_s = parent, cleanup, poll_s
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="nanscope-parent-watch", daemon=True).start()

    def parent_gone(self) -> bool:
        return os.getppid() != self.parent

    def _watch(self) -> None:
        while not self.parent_gone():
            time.sleep(self.poll_s)
        self.exit(PARENT_GONE_EXIT)

    def exit(self, code: int) -> None:
        """os._exit(code), stdout and stderr flushed first (os._exit does not; a dead parent's pipe refuses them
        silently); first too, if the parent is gone, kill the descendants and run the cleanup."""
        with self._lock:  # one caller at a time: the process ends inside
            try:
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(OSError, ValueError):
                        stream.flush()
                if self.parent_gone():
                    wait_gone(kill_tree(os.getpid(), root=False))
                    self.cleanup()
            finally:
                os._exit(code)


def agent(parent: int, cleanup, body) -> None:
    """Run an agent process's `body()` under a ParentWatch of `parent`; its return value is the exit code, an
    exception is printed and exits 1. Ends the process (`ParentWatch.exit`, never returns)."""
    watch = ParentWatch(parent, cleanup=cleanup)
    code = 1
    try:
        code = body()
    except BaseException:  # printed here: the exit below skips the interpreter's handler
        traceback.print_exc()
    finally:
        watch.exit(code)  # stdout and stderr flushed
