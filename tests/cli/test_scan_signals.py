"""`scan DIR` stopped by a signal: it ends now, every process it started with it, and leaves no temp dir (issue 42).

A directory of 1,000 dumps (hard links to one 6 MB dump) would take its two workers many minutes; the signal comes as
soon as a worker runs. Ctrl-C reaches the whole process group, as a terminal sends it; SIGTERM and SIGHUP only the
command, as `kill` and a closed terminal do. The command exits 128 + the signal within a generous bound (a hang
check, not a speed), with one line on stderr; its forkserver, resource tracker and workers are gone, and its
TMPDIR holds no `pymp-*` directory. Whatever happens, the test kills what is left of the tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanscope.dumps import demo, writers
from nanscope.megatron import proctree

FILES = 1000
BOUND_S = 60  # the command's exit after the signal, and its processes' end: a hang check


@pytest.fixture(scope="module")
def many_dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("many")
    samples = [demo.rollout_sample(i, 64, 8000, as_lists=False) for i in range(32)]
    writers.write_rollout_dump(root / "0.pt", samples)
    for i in range(1, FILES):
        os.link(root / "0.pt", root / f"{i}.pt")
    return root


def _all_below(pid: int) -> list[int]:
    tree, out, todo = proctree.children(), [], [pid]
    while todo:
        children = tree.get(todo.pop(), [])
        out += children
        todo += children
    return out


def _wait_for(predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()


@pytest.mark.timeout(240)
# SIGINT and SIGHUP in CI's slow tier: the same path as SIGTERM's
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM,
                                    pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])  # fmt: skip
def test_a_stop_signal_ends_scan_dir_its_workers_and_its_temp_dir(many_dumps, tmp_path, signum):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1"}
    if os.environ.get("NANSCOPE_TEST_SRC"):  # the code before a change (tests/cli/isolated.py)
        env["PYTHONPATH"] = os.environ["NANSCOPE_TEST_SRC"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanscope.cli.main", "scan", str(many_dumps), "--workers", "2", "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the terminal's Ctrl-C is a signal to that group
        # as from a terminal: the signal at its default even under nohup or in a background job (nanscope keeps a
        # signal its user chose to ignore: megatron/proctree.py)
        preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL),
    )
    started: list[int] = []
    try:
        # the resource tracker, the forkserver and its two workers
        started = _wait_for(lambda: pids if len(pids := _all_below(proc.pid)) >= 4 else [], 120)
        assert len(started) >= 4, (started, proc.poll())
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=BOUND_S)
        name = signal.Signals(signum).name
        assert (proc.returncode, err) == (128 + signum, f"nanscope scan: interrupted by {name}; its workers stopped\n")
        assert proctree.wait_gone(started, BOUND_S) == []
        assert list(temp.iterdir()) == []  # multiprocessing's pymp-* directory removed
    finally:
        for pid in [proc.pid, *started]:
            proctree.kill_tree(pid)
        proc.wait(timeout=30)
