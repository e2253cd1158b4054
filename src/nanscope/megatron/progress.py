"""A launch's progress, from rank 0 to the process that launched it: one line a step and a run, in a file of the
launch's out directory (torchrun's ranks and Ray's actors on this machine both write there).

    progress.note(out, run=2, step=3, steps=40)        # rank 0, after each optimizer step
    progress.note(out, run=2)                           # rank 0, after the run's record is written
    with progress.watched(out, callback):               # the launcher: callback(run, step, steps) per line
        ...

Nothing here may harm a run: a line that cannot be written is dropped (the launch's records are what count).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

FILE = "progress.txt"
POLL_S = 0.5  # how often the launcher reads the file

# (run index, step or None when the run is done, steps or None)
Callback = Callable[[int, "int | None", "int | None"], None]


def note(out: Path, *, run: int, step: int | None = None, steps: int | None = None) -> None:
    """Append one line: `run R step S N`, or `run R done`."""
    line = f"run {run} step {step} {steps}\n" if step is not None else f"run {run} done\n"
    with contextlib.suppress(OSError):
        with open(Path(out) / FILE, "a", encoding="ascii") as f:
            f.write(line)


def parse(line: str) -> tuple[int, int | None, int | None] | None:
    """(run, step, steps) of one line `note` wrote; None for anything else (a line cut by a crash)."""
    words = line.split()
    numbers = words[1::2] + words[4:]  # R, S, N
    if len(words) == 5 and words[0] == "run" and words[2] == "step" and all(w.isdigit() for w in numbers):
        return int(words[1]), int(words[3]), int(words[4])
    if len(words) == 3 and words[0] == "run" and words[1].isdigit() and words[2] == "done":
        return int(words[1]), None, None
    return None


class _Tail:
    """Reads the lines the ranks add to `path`, calling `callback` for each whole one, on a thread."""

    def __init__(self, path: Path, callback: Callback) -> None:
        self.path, self.callback = path, callback
        self.offset, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._loop, name="nanscope-progress", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(POLL_S):
            self.read()

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not written yet
            return
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        for line in whole.decode("ascii", "replace").splitlines():
            event = parse(line)
            if event is not None:
                with contextlib.suppress(OSError):  # stderr gone: the launch goes on, its records count
                    self.callback(*event)


@contextlib.contextmanager
def watched(out: Path, callback: Callback | None):
    """While the block runs, `callback(run, step, steps)` for each line the ranks write to `out`; the last lines
    are read when it ends."""
    if callback is None:
        yield
        return
    tail = _Tail(Path(out) / FILE, callback)
    tail.thread.start()
    try:
        yield
    finally:
        tail.stop.set()
        tail.thread.join()
        tail.read()
