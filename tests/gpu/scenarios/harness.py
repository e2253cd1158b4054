"""The CPU harness on a GPU node: `nanscope repro` with CUDA visible gives the CPU's results, and none of its
processes holds the GPU.

    python -m tests.gpu.scenario harness OUT.json

Two commands, each run twice on this machine: as a user runs it (CUDA visible: this process sees the device) and
with `CUDA_VISIBLE_DEVICES=` (the CPU-only view). The default matrix (`nanscope repro`) and the plugin's run
(`nanscope repro --hazard kl-exp-overflow --steps 3 --inject-step 2 --plugin`). For each: the exit code, the JSON's
differences between the two runs once timings, temp paths and which rank raised first are set aside (`comparable`),
and what each process of the visible run was started with (tests/processes.py: its CUDA variables from
/proc/PID/environ, whether it mapped the CUDA driver or opened /dev/nvidia-uvm). The same check on this process
after it allocated on the device (`control`) shows that the check sees a process that holds the GPU.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.processes import ProcessWatch, cuda_driver

COMMANDS = {
    "matrix": ["repro"],
    "plugin": ["repro", "--hazard", "kl-exp-overflow", "--steps", "3", "--inject-step", "2", "--plugin"],
}
VOLATILE = {"wall_s", "seconds", "time", "error_time", "first_failure", "verdict", "started", "pid"}
_TMP = re.compile(r"/[^\s'\"]*?(nanscope-[\w-]+|reports-(visible|hidden))")


def main(out: dict, argv: list[str]) -> None:
    import torch

    out["cuda_available_here"] = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        for name, command in COMMANDS.items():
            out[name] = compare(Path(tmp), name, command)
    torch.ones(1, device="cuda").sum().item()  # this process now holds a CUDA context
    out["control"] = {"pid": os.getpid(), "cuda_driver": cuda_driver(os.getpid())}


def compare(tmp: Path, name: str, command: list[str]) -> dict:
    """The command with CUDA visible (watched) and hidden; their exit codes, seconds and differences."""
    runs = {}
    for view in ("visible", "hidden"):
        argv = [*command, "--json", str(tmp / f"{name}-{view}.json")]
        if "--plugin" in command:
            argv += ["--report-dir", str(tmp / f"reports-{view}")]
        env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if view == "hidden" else {})}
        runs[view] = _run(argv, env, tmp / f"{name}-{view}.json")
    visible, hidden = runs["visible"], runs["hidden"]
    return {
        "returncodes": {view: run["returncode"] for view, run in runs.items()},
        "seconds": {view: run["seconds"] for view, run in runs.items()},
        "ok": {view: run["doc"].get("ok") for view, run in runs.items()},
        "differences": differences(comparable(visible["doc"]), comparable(hidden["doc"])),
        "processes": visible["processes"],
        "output_tail": visible["output"][-3000:],
    }


def _run(argv: list[str], env: dict, json_path: Path) -> dict:
    started = time.time()
    with subprocess.Popen([sys.executable, "-m", "nanscope.cli.main", *argv], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:  # fmt: skip
        with ProcessWatch(proc.pid, poll_s=0.2, include_root=True) as watch:
            output, _ = proc.communicate(timeout=600)
    seen = [
        {
            "pid": s.pid,
            "root": s.pid == proc.pid,
            "cmdline": s.cmdline[:200],
            "environ": s.environ,
            "cuda_driver": s.cuda_driver,
        }
        for s in watch.seen.values()
    ]
    doc = json.loads(json_path.read_text()) if json_path.exists() else {}
    return {"returncode": proc.returncode, "seconds": time.time() - started, "doc": doc, "processes": seen,
            "output": output}  # fmt: skip


def comparable(value):
    """`value` without what differs between two runs of one command on one machine: timings, temp paths, which
    rank's error came first (a race), NaN as a string (NaN != NaN)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, str):
        return _TMP.sub("<tmp>", value)
    return value


def differences(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ, as paths (at most 50)."""
    if type(a) is not type(b):
        return [f"{path}: {a!r:.80} != {b!r:.80}"]
    if isinstance(a, dict):
        out = [f"{path}/{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{path}/{k}")
        return out[:50]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")][:50]
    return [] if a == b else [f"{path}: {a!r:.80} != {b!r:.80}"]
