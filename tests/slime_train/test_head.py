"""The Ray head of `repro --slime-src`: what a driver leaves running ends with the run (issue 42)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from nanscope.megatron import proctree
from nanscope.slime_train import head

DETACHING_TRAIN_PY = """\
import os, sys, time
if os.fork() == 0:  # a child that detaches: a sleeper in a session of its own, its parent gone
    os.setsid()
    if os.fork() == 0:
        open(sys.argv[1], "w").write(str(os.getpid()))
        time.sleep(600)
    os._exit(0)
print("detached", flush=True)
"""


@pytest.mark.slow  # a local Ray instance
@pytest.mark.timeout(300)
def test_a_process_train_py_detaches_ends_with_the_head(tmp_path):
    pytest.importorskip("ray")
    work = Path(tempfile.mkdtemp(prefix="ns-", dir="/tmp"))  # short: Ray's sockets must fit AF_UNIX
    pid_file = tmp_path / "detached.pid"
    (tmp_path / "train.py").write_text(DETACHING_TRAIN_PY)
    launch = head.DriverLaunch(
        name="as-is", argv=(str(pid_file),), env={}, stdout=str(tmp_path / "out"), stderr=str(tmp_path / "err")
    )
    request = head.HeadRequest(
        train_py=str(tmp_path / "train.py"), cwd=str(tmp_path), cpus=1, gpus=0, ray_temp=str(work / "ray"),
        launches=(launch,), result=str(tmp_path / "result.json"),
    )  # fmt: skip
    (work / "ray").mkdir()
    (tmp_path / "head.json").write_text(request.to_json())
    try:
        with proctree.StopSignals() as stop:
            code, timed_out, output = proctree.run_tree(
                [sys.executable, "-m", head.__name__, str(tmp_path / "head.json"), "--parent", str(os.getpid()),
                 "--parent-tmp", str(work)],
                env=dict(os.environ), timeout_s=240, stop=stop,
            )  # fmt: skip
        assert (code, timed_out) == (0, False), output[-3000:]
        assert (tmp_path / "out").read_text() == "detached\n"
        assert proctree.wait_gone([int(pid_file.read_text())], 30) == []
    finally:
        if pid_file.exists():
            proctree.kill_tree(int(pid_file.read_text()))
        shutil.rmtree(work, ignore_errors=True)
