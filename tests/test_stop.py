"""A test run that is told to stop stops: SIGTERM to pytest while a test holds a harness launch ends the session
(the launch's processes killed first), instead of turning into that test's failure and going on for minutes."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = """\
import time
from nanscope.cli.main import main

def test_a_long_launch():
    main(["repro", "--hazard", "kl-exp-overflow", "--steps", "12", "--inject-step", "12"])

def test_after_it():
    open({marker!r}, "w").write("ran")
"""


def _workers_started(pid: int) -> bool:
    out = subprocess.run(["pgrep", "-f", "nanscope.megatron.worker", "-P", str(pid)], capture_output=True, text=True)
    return bool(out.stdout.strip())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_during_a_launch_ends_the_session(tmp_path):
    marker = tmp_path / "after.txt"
    (tmp_path / "test_long.py").write_text(TESTS.format(marker=str(marker)))
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not _workers_started(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None and time.monotonic() < deadline, "the launch did not start"
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30, out
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopped by SIGTERM" in out
    assert not marker.exists()  # the next test never ran
