"""What a healthy step costs the host and the memory with the plugin, against the same step without it.

    python benchmarks/plugin_audit.py                 # vocab 512, 8192 and 32768; 4 and 8 micro-batches
    python benchmarks/plugin_audit.py --vocab 8192 --samples 4

Each row is one run of tests/slime_plugin/audit_worker.py (one process, real megatron-core on CPU, the tiny
Qwen3-MoE in fp32 under DDP and the distributed optimizer, slime v0.1.0's train_one_step, one sample per
micro-batch), counted at dispatch and at the Python level by tests/slime_plugin/audit.py:

    syncs     what would make the host wait on a GPU (`.item()`, nonzero, masked_select, boolean masks,
              device-to-host copies, `.tolist()`, `torch.tensor(..., device=)` from Python values), by owner:
              the run's own (megatron, slime's loss) without and with the plugin, and the plugin's
    largest   the largest new tensor the plugin's code made, against the step's logits tensor (one micro-batch's
              [S, V] float32, the last chunk's output)

Counts, not times: they do not move with the box's load. The hook alone (over slime's own loss), then the hook
with the plugin's NaN-safe loss (--loss-type custom_loss).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "tests" / "slime_plugin" / "audit_worker.py"


def audit(vocab: int, samples: int, plugin_loss: bool) -> dict:
    with tempfile.TemporaryDirectory() as reports:
        flags = ["--vocab", str(vocab), "--samples", str(samples), "--report-dir", reports]
        proc = subprocess.run(
            [sys.executable, str(WORKER), *flags, *(["--plugin-loss"] if plugin_loss else [])],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, nargs="*", default=[512, 8192, 32768])
    p.add_argument("--samples", type=int, nargs="*", default=[4, 8])
    a = p.parse_args()
    print("| plugin | vocab | micro-batches | run's syncs without / with | plugin's syncs | plugin's largest "
          "tensor | logits | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for plugin_loss in (False, True):
        for vocab in a.vocab:
            for samples in a.samples:
                r = audit(vocab, samples, plugin_loss)
                size, op = r["plugin_largest"]
                kinds = ", ".join(
                    f"{k.removeprefix('plugin: ')} {n}" for k, n in r["with"].items() if k.startswith("plugin")
                )
                print(
                    f"| {'hook + loss' if plugin_loss else 'hook'} | {vocab} | {samples} | {r['run_syncs'][0]} / "
                    f"{r['run_syncs'][1]} | {r['plugin_syncs']} ({kinds}) | {size:,} B ({op}) | "
                    f"{r['logits_bytes']:,} B | 1/{r['logits_bytes'] // max(size, 1)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
