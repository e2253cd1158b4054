"""Run one GPU scenario in a subprocess and read back the JSON it writes.

A scenario is a module under tests/gpu/scenarios/ with `main(out: dict, args: list[str]) -> None`: it fills
`out` with what it measured. `python -m tests.gpu.scenario NAME OUT.json [ARGS...]` runs it, adds `machine`
(torch, CUDA, the GPU, TransformerEngine and apex present or not, the shims applied) and writes OUT.json, also
when the scenario raises (then with `error`). `run` is the parent's side, with a hard timeout; where
NANSCOPE_TEST_GPU_OUT names a folder (tests/gpu/run_on_device.sh), it keeps a copy of each JSON there.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def machine() -> dict:
    """The facts every figure is recorded with."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "transformer_engine": importlib.util.find_spec("transformer_engine") is not None,
        "apex": importlib.util.find_spec("apex") is not None,
    }


def run(name: str, out: Path, *args: str, timeout_s: float = 300, env: dict | None = None) -> dict:
    """Run scenario `name` in a fresh interpreter (one device: CUDA_VISIBLE_DEVICES kept as the parent has it)."""
    cmd = [sys.executable, "-m", "tests.gpu.scenario", name, str(out), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
    assert out.exists(), f"scenario {name} wrote nothing (exit {proc.returncode}): {proc.stderr[-4000:]}"
    keep = os.environ.get("NANSCOPE_TEST_GPU_OUT")  # the device script's folder of every scenario's JSON
    if keep:
        shutil.copyfile(out, Path(keep) / out.name)  # each caller names its run (loss_releases-v0.1.0.json)
    result = json.loads(out.read_text())
    assert "error" not in result, f"scenario {name} raised:\n{result['error']}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, proc.stderr[-4000:]
    return result


def _main(argv: list[str]) -> int:
    name, path, args = argv[0], Path(argv[1]), argv[2:]
    out: dict = {"scenario": name}
    try:
        importlib.import_module(f"tests.gpu.scenarios.{name}").main(out, args)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent reads the error from the JSON
        out["error"] = traceback.format_exc()
        code = 1
    out["machine"] = machine()
    shims = sys.modules.get("nanscope.megatron.te_less")
    out["machine"]["shims"] = list(shims.applied()) if shims is not None and hasattr(shims, "applied") else []
    path.write_text(json.dumps(out, indent=1, default=str))
    return code


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
