"""proctree.run_tree: a command as its own process tree, its output captured, killed whole at the deadline."""

import os
import sys
import time

import pytest

from nanscope.megatron import proctree
from nanscope.megatron.proctree import StopSignals


def test_a_command_that_ends_returns_its_code_and_output():
    with StopSignals() as stop:
        code, timed_out, output = proctree.run_tree(
            [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
            env=dict(os.environ), timeout_s=60, stop=stop,
        )  # fmt: skip
    assert (code, timed_out) == (3, False) and output.split() == ["out", "err"]


@pytest.mark.slow  # the fast tier kills a launch's tree at its deadline (tests/megatron/test_harness.py)
def test_a_tree_past_its_deadline_is_killed_with_its_descendants(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    with StopSignals() as stop:
        code, timed_out, output = proctree.run_tree(
            [sys.executable, "-c", script], env=dict(os.environ), timeout_s=3, stop=stop
        )
    assert timed_out and code != 0 and "started" in output
    assert time.monotonic() - started < 60
    assert not proctree.alive(int(pid_file.read_text()))  # the grandchild, in a session of its own, is gone too


DETACH = (
    "import os, sys, time\n"
    "from nanscope.megatron import proctree\n"
    "proctree.adopt_orphans()\n"
    "if os.fork() == 0:\n"  # a child that detaches: it forks a sleeper, in a session of its own, and exits
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "        time.sleep(600)\n"
    "    os._exit(0)\n"
    "print('started', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_a_process_that_detaches_from_a_root_that_adopts_orphans_dies_at_the_deadline(tmp_path):
    # issue 42: a train.py that detaches a process survived --slime-src's --timeout (re-parented to init)
    pid_file = tmp_path / "detached.pid"
    with StopSignals() as stop:
        code, timed_out, output = proctree.run_tree(
            [sys.executable, "-c", DETACH, str(pid_file)], env=dict(os.environ), timeout_s=5, stop=stop
        )
    try:
        assert timed_out and "started" in output
        detached = int(pid_file.read_text())
        assert proctree.wait_gone([detached], 30) == []
    finally:
        if pid_file.exists():
            proctree.kill_tree(int(pid_file.read_text()))
