"""Builders of hostile dumps for the tests: files whose declared sizes or nesting would blow up a naive reader,
and `isolated`, which runs `nanscope` on them each in a process of its own under a memory limit.

Most are plain `torch.save` of a crafted object (an expanded view, a meta or sparse tensor); nesting
deeper than Python's recursion limit cannot be pickled by Python itself, so `with_raw` splices raw
pickle opcodes in place of a placeholder string and writes the archive with torch's own zip writer.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch

from tests.address_space import CAP

# RLIMIT_AS of every case: what the driver's imports mapped (tests/address_space.py: 0.6 GiB with a CPU build of
# torch, several GiB with a CUDA build) plus this budget, which scanning a real dump fits in and a naive reader's
# allocation (GiBs to TiBs) does not. With a CPU build the cap is the 2 GiB it always was.
CASE_BUDGET = 1408 << 20
CASE_SECONDS = 20  # SIGALRM per case

# One driver process imports nanscope once under the limit and forks a child per case, so a case costs
# milliseconds, not an interpreter start. A child's peak RSS (VmHWM) starts at its RSS at the fork: the
# growth is what the case itself touched.
DRIVER = r"""
import json, os, signal, sys, time
budget, seconds, cases = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.stdin.read())
from nanscope.cli.main import build_parser, main
from nanscope.dumps import checks, io
from nanscope.trace.tracer import replay
build_parser()  # every command's imports, once, before the forks
cap(budget)  # what they mapped, plus the cases' budget

def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) * 1024

results = []
for argv in cases:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        signal.alarm(seconds)
        start, t0 = status("VmRSS:"), time.perf_counter()
        try:
            rc = main(argv)
        except BaseException as e:  # argparse's SystemExit: report, never pass
            print(f"driver: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 99
        grew = {"grew": status("VmHWM:") - start, "seconds": time.perf_counter() - t0}
        print("\n--measured-- " + json.dumps(grew), file=sys.stderr)
        sys.stderr.flush()
        os._exit(rc)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    head, mark, measured = err.rpartition("\n--measured-- ")
    result = {"rc": code, "stderr": head if mark else err, "grew": None, "seconds": None}
    if mark:  # the child got as far as measuring (not killed by the limit or the alarm)
        result.update(json.loads(measured))
    results.append(result)
print(json.dumps(results))
"""


def isolated(cases: list[list[str]]) -> list[dict]:
    """`nanscope ARGV` for each case, each in its own forked process under RLIMIT_AS (the driver's imports plus
    CASE_BUDGET) and SIGALRM.

    Returns:
        {"rc", "stderr", "grew": bytes the case added to the process's peak RSS, "seconds"} per case
        (grew and seconds None for a case killed before it measured). NANSCOPE_TEST_SRC=/tmp/baseline/src
        runs the cases against another source tree: how a test is shown to fail on the code before it.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if os.environ.get("NANSCOPE_TEST_SRC"):
        env["PYTHONPATH"] = os.environ["NANSCOPE_TEST_SRC"]
    proc = subprocess.run(
        [sys.executable, "-c", CAP + DRIVER, str(CASE_BUDGET), str(CASE_SECONDS)],
        env=env,
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60 + CASE_SECONDS * len(cases),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


PLACEHOLDER = "NANSCOPE_PLACEHOLDER"


def torch_zip(path: str | Path, data_pkl: bytes, records: dict[str, bytes] | None = None) -> Path:
    """A torch.save-format archive (torch's own writer) whose data.pkl is `data_pkl`, with `records` (storages
    as data/<key>, byteorder, ...; byteorder little by default)."""
    path = Path(path)
    w = torch._C.PyTorchFileWriter(str(path))
    w.write_record("data.pkl", data_pkl, len(data_pkl))
    for name, data in {"byteorder": b"little", **(records or {})}.items():
        w.write_record(name, data, len(data))
    w.write_end_of_file()
    return path


def records(path: str | Path) -> dict[str, bytes]:
    """Every record of a torch.save archive, by name (data.pkl included)."""
    r = torch._C.PyTorchFileReader(str(path))
    return {name: r.get_record(name) for name in r.get_all_records() if not name.startswith(".data/")}


def rewrap(src: str | Path, dst: str | Path, data_pkl: bytes) -> Path:
    """`src`'s archive with its data.pkl replaced by `data_pkl` (storages kept)."""
    recs = records(src)
    del recs["data.pkl"]
    return torch_zip(dst, data_pkl, recs)


def with_raw(path: str | Path, obj, raw: bytes) -> Path:
    """`obj` pickled (protocol 2, as torch.save) with the one PLACEHOLDER string in it replaced by `raw` opcodes."""
    data = pickle.dumps(obj, protocol=2)
    mark = b"X" + len(PLACEHOLDER).to_bytes(4, "little") + PLACEHOLDER.encode()
    assert data.count(mark) == 1, "obj must hold PLACEHOLDER exactly once"
    return torch_zip(path, data.replace(mark, raw))


def nested_list(depth: int) -> bytes:
    """Opcodes of [[[...]]] nested `depth` deep: push the lists, then append each into the one below."""
    return b"]" * depth + b"a" * (depth - 1)


def nested_dict(depth: int, key: str = "a") -> bytes:
    """Opcodes of {key: {key: ...}} nested `depth` deep (innermost {}), each key memoized once."""
    k = key.encode()
    put = b"X" + len(k).to_bytes(4, "little") + k + b"q\xff"  # the key, memoized at 255
    return b"}" + put + b"}" + (b"h\xff}" * (depth - 2)) + b"s" * (depth - 1)


def rollout(sample: dict) -> dict:
    """A one-sample rollout dump around `sample` (tokens, response_length and reward filled in if absent)."""
    return {"rollout_id": 0, "samples": [{"tokens": [1, 2, 3], "response_length": 2, "reward": 1.0, **sample}]}


def train(**rollout_data) -> dict:
    """A one-sample train dump (tokens and response_lengths filled in if absent)."""
    data = {"tokens": [torch.zeros(4, dtype=torch.long)], "response_lengths": [2], **rollout_data}
    return {"rollout_id": 0, "rank": 0, "rollout_data": data}
