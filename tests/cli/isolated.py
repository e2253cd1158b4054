"""`nanscope ARGV` for many cases, each in its own forked process with a wall-clock alarm.

One driver process imports nanscope (torch, megatron-core, tree-sitter) once and forks a child per case, so a
case costs milliseconds, not an interpreter start. A case that hangs (a FIFO opened for writing blocks until a
reader comes) dies of SIGALRM: its exit code is -14, never a pass. stdin and stdout are /dev/null; stderr is
returned. NANSCOPE_TEST_SRC=/tmp/baseline/src runs the cases against another source tree (the fixtures are
still made by this one): how a test is shown to fail on the code before a change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASE_SECONDS = 90  # SIGALRM per case: a hang check (`doctor --case` took over 20 s at load 11), not a speed
IMPORT_SECONDS = 60  # the driver's imports
PRELOAD = (
    "nanscope.dumps.checks",
    "nanscope.dumps.io",
    "nanscope.hazards",
    "nanscope.launch",
    "nanscope.megatron.faults",
    "nanscope.report.doctor.terminal",
    "nanscope.report.repro",
    "nanscope.report.scan",
    "nanscope.trace.tracer.replay",
)

DRIVER = r"""
import json, os, signal, sys
seconds, cases = int(sys.argv[1]), json.loads(sys.stdin.read())
import importlib
from nanscope.cli.main import build_parser, main
build_parser()
for name in sys.argv[2:]:  # the heavy imports the commands make, once, before the forks
    try:
        importlib.import_module(name)
    except ImportError:  # a module of another version of nanscope
        pass
results = []
for case in cases:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.chdir(case["cwd"])
        os.dup2(w, 2)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        signal.alarm(seconds)
        try:
            rc = main(case["argv"])
        except BaseException as e:  # argparse's SystemExit: report, never pass
            print(f"driver: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 99
        sys.stderr.flush()
        os._exit(rc)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    status = os.waitpid(pid, 0)[1]
    results.append({"rc": os.waitstatus_to_exitcode(status), "stderr": err})
print(json.dumps(results))
"""


def run_isolated(cases: list[list[str]], cwd) -> list[dict]:
    """{"rc", "stderr"} of `nanscope ARGV` for each case, run in `cwd`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    if os.environ.get("NANSCOPE_TEST_SRC"):
        env["PYTHONPATH"] = os.environ["NANSCOPE_TEST_SRC"]
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(CASE_SECONDS), *PRELOAD],
        input=json.dumps([{"argv": argv, "cwd": str(cwd)} for argv in cases]),
        capture_output=True,
        text=True,
        env=env,
        timeout=IMPORT_SECONDS + CASE_SECONDS * len(cases),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def refused(result: dict, command: str) -> str:
    """Exit 2 and exactly one `nanscope COMMAND: error: ` line on stderr: the line's message."""
    lines = result["stderr"].splitlines()
    prefix = f"nanscope {command}: error: "
    assert result["rc"] == 2 and len(lines) == 1 and lines[0].startswith(prefix), result
    return lines[0][len(prefix) :]
