"""A rank's bound on each phase: a hung collective (peers that raised, or died) ends the rank, not the launch.

    wd = Watchdog(out_dir, rank)
    wd.arm("run 3 step 2: train_one_step", 120.0)   # os._exit(3) if still in this phase after 120 s

The watchdog leaves `stuck.rank{r}.txt` (its message) for the parent, which reports who was stuck.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from pathlib import Path


class Watchdog:
    """Ends this process with os._exit(3) when a phase outlives its bound (a hung collective)."""

    def __init__(self, out: Path, rank: int):
        self.out, self.rank = out, rank
        self.phase, self.deadline = "startup", float("inf")
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.phase, self.deadline = phase, time.monotonic() + seconds

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                late = time.monotonic() > self.deadline
                phase = self.phase
            if late:
                msg = f"rank {self.rank}: watchdog: stuck in {phase}; exiting"
                (self.out / f"stuck.rank{self.rank}.txt").write_text(msg)
                print(msg, file=sys.stderr, flush=True)
                os._exit(3)


def barrier(wd: Watchdog, seconds: float, what: str) -> None:
    """A barrier of every rank, bounded by `seconds` (and by the watchdog, 5 s later)."""
    import torch.distributed as dist  # heavy: torch, in the ranks only

    wd.arm(f"barrier before {what}", seconds + 5)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=seconds), wait_all_ranks=True)
