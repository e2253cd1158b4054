"""tests/processes.py's ProcessWatch: the environment it records is the one of the program a process runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nanscope.megatron import hidden_cuda
from tests.processes import ProcessWatch, environ

CHILD = {"CUDA_VISIBLE_DEVICES": "nanscope-test", "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
         "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": None}  # fmt: skip


@pytest.mark.timeout(60)
def test_a_child_caught_between_its_fork_and_its_exec_is_recorded_with_its_own_environment():
    """A watch records the launch's torchrun with the environment it was started with, not the test process's,
    which its environ shows until its exec: seen first there, it was recorded so (a flaky failure under load of
    test_every_process_of_the_launch_sees_no_cuda_device). Here the window is a second long, not a moment."""
    env = {k: v for k, v in os.environ.items() if k not in hidden_cuda.NAMES}
    env |= {k: v for k, v in CHILD.items() if v is not None}
    code = "import time; time.sleep(0.5)"
    with ProcessWatch(os.getpid(), poll_s=0.05) as watch:
        child = subprocess.Popen([sys.executable, "-c", code], env=env, preexec_fn=lambda: time.sleep(1.0))
        child.wait(timeout=30)
    (seen,) = watch.seen.values()
    assert (seen.pid, seen.environ, seen.cmdline, seen.forked) == (child.pid, CHILD, f"{sys.executable} -c {code}",
                                                                   False)  # fmt: skip


@pytest.mark.timeout(60)
def test_a_child_forked_without_exec_is_recorded_with_its_parents_environment():
    """A fork that never execs (a rank torchrun's agent forks) is still one of the processes the watch records:
    with the environment its parent was started with, what it runs with."""
    with ProcessWatch(os.getpid(), poll_s=0.05) as watch:
        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(0.5)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    (seen,) = watch.seen.values()
    assert (seen.pid, seen.environ, seen.forked) == (pid, environ(os.getpid()), True)
