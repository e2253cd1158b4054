"""`nanscope doctor`'s CPU seconds and peak memory on each kind of input (issues 41 and 42): the bundled case, a
20-line launch script of another framework, the case at 2^20 ranks, a 100 MB job log whose lines are metric lines,
a 100 MB log of DeepSpeed/transformers lines with NaN evidence, a 100 MB log of Megatron iteration lines wrapped over
four lines each, the same lines unwrapped, and each real report of tests/fixtures/reports/real, real2 and real3.

Each run is its own process, measured by the kernel (os.wait4's rusage of that child: user + system CPU, and its
peak resident set), so the figures include Python's start and every import.

    python benchmarks/doctor_inputs.py [--log-mb 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "reports" / "real"
REAL2 = ROOT / "tests" / "fixtures" / "reports" / "real2"
REAL3 = ROOT / "tests" / "fixtures" / "reports" / "real3"
LAUNCH = """#!/bin/bash
# a LLaMA-Factory-style command, 20 lines
export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
torchrun --nproc_per_node 8 --nnodes 1 \\
    src/train.py \\
    --stage sft \\
    --do_train \\
    --model_name_or_path /models/qwen2.5-7b \\
    --dataset alpaca_en \\
    --template qwen \\
    --finetuning_type full \\
    --output_dir /out \\
    --per_device_train_batch_size 2 \\
    --gradient_accumulation_steps 8 \\
    --lr_scheduler_type cosine \\
    --logging_steps 1 \\
    --learning_rate 1e-5 \\
    --num_train_epochs 3 \\
    --bf16 \\
    --deepspeed ds_z3.json
"""


def _run(argv: list[str]) -> tuple[int, float, float, float]:
    """(exit code, CPU seconds, peak RSS MiB, wall seconds) of `nanscope doctor ARGV` in a fresh process, from the
    kernel's accounting of that one child (os.wait4)."""
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "nanscope.cli.main", "doctor", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "100"},
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, time.monotonic() - start


def _metric_log(path: Path, size: int) -> None:
    """Transformers dicts every line, a DeepSpeed overflow every 1,000, a NaN dict at the end."""
    line = "{'loss': 1.2345, 'grad_norm': 3.21, 'learning_rate': 1e-05, 'epoch': 0.12}\n"
    overflow = "[2025-01-01 00:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 " \
               "Skipping step. Attempted loss scale: 65536, reducing to 32768\n"  # fmt: skip
    block = (line * 999 + overflow).encode()
    with open(path, "wb") as out:
        for _ in range(size // len(block) + 1):
            out.write(block)
        out.write(b"{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.9}\n")


def _wrapped_log(path: Path, size: int) -> None:
    """Megatron iteration lines wrapped over four lines at `|` (launch/wrapped.py joins each), a NaN at the end."""
    record = (
        " iteration {i:8d}/ 1000000 | elapsed time per iteration: 812.4 ms |\n learning rate: 3.0E-04 | global batch "
        "size:   64 |\n lm loss: 2.1E+00 | loss scale: 1.0 | grad norm: {g} |\n number of skipped iterations:   0 | "
        "number of nan iterations:   0 |\n"
    )
    block = "".join(record.format(i=i, g="1.02") for i in range(1000)).encode()
    with open(path, "wb") as out:
        for _ in range(size // len(block) + 1):
            out.write(block)
        out.write(record.format(i=10**6, g="nan").encode())


def _megatron_log(path: Path, size: int) -> None:
    """Megatron iteration lines, one a line, a NaN at the end."""
    record = (
        " iteration {i:8d}/ 1000000 | consumed samples: {c:12d} | elapsed time per iteration (ms): 812.4 | learning "
        "rate: 3.0E-04 | global batch size:   64 | lm loss: 2.1E+00 | loss scale: 1.0 | grad norm: {g} | number of "
        "skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    block = "".join(record.format(i=i, c=i * 64, g="1.02") for i in range(1000)).encode()
    with open(path, "wb") as out:
        for _ in range(size // len(block) + 1):
            out.write(block)
        out.write(record.format(i=10**6, c=0, g="nan").encode())


def _driver_log(path: Path, size: int) -> None:
    """A Ray driver log of slime metric lines, then the bundled case's traceback."""
    step = (
        "\x1b[36m(MegatronTrainRayActor pid=2526{i:03d}, ip=172.27.6.1)\x1b[0m [2025-08-30 12:01:00] model.py:329 - "
        "rollout {i}: {{'train/loss': 0.0123, 'train/grad_norm': 1.52, 'train/ppo_kl': 1.3e-05}}\n"
    )
    case = (ROOT / "src" / "nanscope" / "cases" / "slime-795" / "traceback.txt").read_bytes()
    block = "".join(step.format(i=i) for i in range(1000)).encode()
    with open(path, "wb") as out:
        for _ in range(size // len(block) + 1):
            out.write(block)
        out.write(case)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-mb", type=int, default=100)
    parser.add_argument("--keep", help="write the generated inputs here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(args.keep or scratch)
        where.mkdir(parents=True, exist_ok=True)
        (where / "launch.sh").write_text(LAUNCH)
        _driver_log(where / "driver.log", args.log_mb << 20)
        _metric_log(where / "metrics.log", args.log_mb << 20)
        _wrapped_log(where / "wrapped.log", args.log_mb << 20)
        _megatron_log(where / "megatron.log", args.log_mb << 20)
        runs = [
            ("the bundled case (script + traceback)", ["--case", "slime-795"]),
            ("the case at 2^20 ranks", ["--case", "slime-795", "--env", "TOTAL_NODES=131072"]),
            ("a 20-line launch script (torchrun, transformers)", [str(where / "launch.sh")]),
            (f"a {args.log_mb} MB Ray driver log, then the case's traceback", ["--traceback", str(where / "driver.log")]),
            (f"a {args.log_mb} MB log of transformers dicts and DeepSpeed overflows", ["--traceback", str(where / "metrics.log")]),
            (f"a {args.log_mb} MB log of Megatron lines wrapped over 4 lines", ["--traceback", str(where / "wrapped.log")]),
            (f"a {args.log_mb} MB log of Megatron lines", ["--traceback", str(where / "megatron.log")]),
        ]  # fmt: skip
        for root in (REAL, REAL2, REAL3):
            runs += [
                (f"real report {root.name}/{path.stem}", ["--traceback", str(path)])
                for path in sorted(root.glob("*.txt"))
            ]
            runs += [(f"real launch {root.name}/{path.stem}", [str(path)]) for path in sorted(root.glob("*.sh"))]
        print("| input | exit | CPU s | peak RSS MiB | wall s |\n|---|---|---|---|---|")
        for name, argv in runs:
            code, cpu, rss, wall = _run(argv)
            print(f"| {name} | {code} | {cpu:.2f} | {rss:.0f} | {wall:.2f} |")


if __name__ == "__main__":
    main()
