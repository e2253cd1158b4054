"""One process that sees CUDA (torch.cuda.is_available() True, one device) runs the harness on CPU.

    python tests/megatron/cuda_visible_worker.py OUT_DIR     # prints the runs' RankRecords as JSON

What `nanscope repro` meets on a GPU machine: bootstrap.init must still switch the CPU layer on, and
the harness build the model and run a healthy step and a hazard step (megatron's NaN check) on CPU.

A CPU build of torch is told it has a device; on a GPU the device is real. A CUDA build without one cannot be told:
torch's AdamW then asks the CUDA driver whether its stream is capturing (is_current_stream_capturing), and there is
no driver; the worker prints {"skip": why} instead (the GPU tier's `harness` scenario runs the harness on a GPU).
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch

CANNOT_PRETEND = torch.version.cuda is not None and not torch.cuda.is_available()
if torch.version.cuda is None:
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1


def main(out: Path) -> None:
    if CANNOT_PRETEND:
        print(json.dumps({"skip": "a CUDA build of torch without a device cannot be told it has one"}))
        return
    from nanscope import case
    from nanscope.megatron import bootstrap, cpu
    from nanscope.megatron.run import Runner
    from nanscope.megatron.spec import Layout, RunSpec, WorkerSpec
    from nanscope.megatron.watchdog import Watchdog

    bootstrap.init()
    runs = (RunSpec("healthy"), RunSpec("kl-exp-overflow"))
    spec = WorkerSpec(
        Layout(tp=1, pp=1), runs, rank_timeout_s=120, startup_timeout_s=60, bf16=True, loss_flags=case.loss_flags()
    )
    runner = Runner(spec, out, Watchdog(out, rank=0))
    records = [dataclasses.asdict(runner.execute(i, run)) for i, run in enumerate(runs)]
    print(json.dumps({"patched": cpu.installed(), "records": records}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
