"""`nanscope doctor --traceback LOG` on a whole job log: how fast the stream reader goes, against reading the
same file line by line with nothing done, side by side in one run (the figure tests/cli/test_doctor_logs.py held
as an assertion until issue 42; the test keeps its answer and bounded memory, without a speed).

The log is the test's: a 64-rank Ray driver log of --mb MiB of actor and raylet lines (coloured prefixes), the
case's traceback, then three other ranks' failures. Each phase is timed in CPU seconds of this process
(time.process_time: the box is shared, wall time is not this process's alone), best of --rounds, in rotating
order; then the reader's peak of traced memory once (tracemalloc slows it, so it is timed apart).

    python benchmarks/doctor_log.py                # 48 MiB, 3 rounds
    python benchmarks/doctor_log.py --mb 200 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test's log generator: the same bytes it reads

from tests.cli.test_doctor_logs import _driver_log  # noqa: E402

from nanscope.launch.tracebacks import read_traceback  # noqa: E402


def _plain(path: str) -> None:
    with open(path, "rb") as f:
        for _ in f:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "driver.log")
        _driver_log(Path(log), args.mb << 20)
        size = os.path.getsize(log)
        phases = {"lines read, nothing done": _plain, "doctor's stream reader": read_traceback}
        best = dict.fromkeys(phases, float("inf"))
        for i in range(args.rounds):
            for name in list(phases)[i % 2 :] + list(phases)[: i % 2]:
                start = time.process_time()
                phases[name](log)
                best[name] = min(best[name], time.process_time() - start)
        tracemalloc.start()
        read_traceback(log)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    print(f"log: {size / 2**20:.1f} MiB; load average at the end {os.getloadavg()[0]:.1f}")
    for name, seconds in best.items():
        print(f"{name:<28} {seconds:6.2f} CPU s  {size / seconds / 1e6:7.1f} MB/s")
    ratio = best["doctor's stream reader"] / best["lines read, nothing done"]
    print(f"reader / plain read: {ratio:.1f}x; reader's peak traced memory {peak / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
