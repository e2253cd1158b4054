"""Throughput and memory of `nanscope scan` on a generated case-sized dump, end to end.

A case-sized rollout is 512 samples (64 prompts x 8) of up to 65,536 tokens: prompts of 512-4,096
tokens and responses of 1-61,440 (--rollout-max-response-len of the case), uniform, so about 17M
tokens. The rollout dump is written as slime v0.1.0 writes it (Python lists inside torch.save); the
train dump as its actor does (tensors, cp=1). Each phase runs in a fresh child process, so its peak
RSS is its own:

    load     torch.load(weights_only=True) of the file
    convert  the lists/tensors of every sample into numpy arrays (the streaming reader)
    checks   every check on already-converted samples (the figure the >= 10M tokens/s target is about)
    e2e      `nanscope scan FILE --json ...` as a user runs it: load + convert + checks + render

Run on a laptop (about 4 minutes and 3 GB of disk in /tmp for the full size; --quick: 64 samples of
up to 8,192 tokens, seconds):

    python benchmarks/scan_throughput.py            # case-sized
    python benchmarks/scan_throughput.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "2")
import torch
torch.set_num_threads(2)
from nanscope.dumps import checks, io
path, phase = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
dump = io.load(path)
t_load = time.perf_counter() - t0
out = {"load_s": t_load}
if phase == "staged":
    t0 = time.perf_counter()
    samples = list(dump.samples())
    out["convert_s"] = time.perf_counter() - t0
    # Best of two runs each, on samples already converted: the checks alone.
    for key, hist in (("checks_s", False), ("checks_hist_s", True)):
        times = []
        for _ in range(2):
            staged = io.Dump.from_samples(path, dump.kind, samples)
            t0 = time.perf_counter()
            result = checks.scan(staged, checks.ScanConfig.for_case(histograms=hist))
            times.append(time.perf_counter() - t0)
        out[key] = min(times)
    out["hazards"] = checks.hazard_count(result)
    out["response_tokens"] = result.response_tokens
out["peak_rss_mb"] = hwm()
print(json.dumps(out))
"""

# Peak RSS of the process itself: VmHWM starts afresh at exec (ru_maxrss would inherit the parent's peak).
HWM = "def hwm():\n    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024\n"


def lengths(n: int, max_total: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, response) per sample: prompt uniform in [512, 4096], response in [1, max_total - 4096]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompt_hi = min(4096, max_total // 2)
    prompts = rng.integers(min(512, prompt_hi), prompt_hi + 1, n)
    responses = rng.integers(1, max_total - prompt_hi + 1, n)
    return list(zip(prompts.tolist(), responses.tolist()))


def write_dumps(tmp: Path, n: int, max_total: int, seed: int) -> None:
    """A rollout dump (lists) and a train dump (tensors) of the same samples, hazards planted in a few."""
    import numpy as np
    import torch

    from nanscope.dumps import demo

    rng = np.random.default_rng(seed)
    samples = []
    for i, (p, r) in enumerate(lengths(n, max_total, seed)):
        s = demo.rollout_sample(i, p, r, reward=float(i % 2), rng=rng, masked_span=(r // 3, r // 2), as_lists=False)
        samples.append(s)
    samples[5]["rollout_log_probs"][0] = float("nan")
    samples[n // 2]["rollout_log_probs"][-1] = -100.0
    train = demo.train_data_from_samples(samples, [0.0] * n)
    demo.write_train_dump(tmp / "12_0.pt", train, rollout_id=12)
    del train
    for s in samples:  # slime writes plain lists
        for k in ("tokens", "loss_mask", "rollout_log_probs"):
            s[k] = s[k].tolist()
    demo.write_rollout_dump(tmp / "12.pt", samples, rollout_id=12)


def child(path: Path, phase: str) -> dict:
    out = subprocess.run([sys.executable, "-c", HWM + CHILD, str(path), phase], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def e2e(path: Path, tmp: Path) -> dict:
    code = HWM + ("import sys, time; t = time.perf_counter(); from nanscope.cli.main import main; "
                  "rc = main(['scan', sys.argv[1], '--json', sys.argv[2], '--no-progress']); "
                  "print('E2E', time.perf_counter() - t, hwm(), rc)")
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code, str(path), str(tmp / "scan.json")], capture_output=True,
                         text=True, env=env, timeout=3600)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("E2E"))
    _, secs, rss, rc = line.split()
    return {"e2e_s": float(secs), "peak_rss_mb": float(rss), "rc": int(rc)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--max-total", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="64 samples of up to 8,192 tokens")
    ap.add_argument("--dir", help="keep the generated dumps here and reuse them on the next run")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.samples, args.max_total = 64, 8192
    if args.generate_only:
        write_dumps(Path(args.dir), args.samples, args.max_total, args.seed)
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.dir or d)
        tmp.mkdir(parents=True, exist_ok=True)
        rollout, train = tmp / "12.pt", tmp / "12_0.pt"
        tokens = sum(p + r for p, r in lengths(args.samples, args.max_total, args.seed))
        if not (rollout.exists() and train.exists()):
            t0 = time.perf_counter()
            # In a child, so this process stays small (children's peak RSS is measured apart anyway).
            subprocess.run([sys.executable, __file__, "--generate-only", "--dir", str(tmp), "--samples",
                            str(args.samples), "--max-total", str(args.max_total), "--seed", str(args.seed)], check=True)
            print(f"generated in {time.perf_counter() - t0:.0f} s")
        print(f"{args.samples} samples, {tokens:,} tokens; rollout dump {rollout.stat().st_size / 2**20:.0f} MiB, "
              f"train dump {train.stat().st_size / 2**20:.0f} MiB")
        for name, path in (("rollout (lists)", rollout), ("train (tensors)", train)):
            staged = child(path, "staged")
            end = e2e(path, tmp)
            resp = staged["response_tokens"]
            rate = lambda s: resp / s / 1e6  # noqa: E731  M response tokens / s
            print(f"{name}: {resp:,} response tokens, {staged['hazards']} hazards, exit {end['rc']}")
            print(f"  load     {staged['load_s']:7.2f} s  {rate(staged['load_s']):7.2f} M tok/s")
            print(f"  convert  {staged['convert_s']:7.2f} s  {rate(staged['convert_s']):7.2f} M tok/s")
            print(f"  checks   {staged['checks_s']:7.2f} s  {rate(staged['checks_s']):7.2f} M tok/s   "
                  f"(with --html histograms {staged['checks_hist_s']:.2f} s, {rate(staged['checks_hist_s']):.2f} M tok/s)")
            print(f"  e2e      {end['e2e_s']:7.2f} s  {rate(end['e2e_s']):7.2f} M tok/s   peak RSS {end['peak_rss_mb']:.0f} MB "
                  f"(load+convert+checks alone: {staged['peak_rss_mb']:.0f} MB)")
            print(f"  ratios   load/checks {staged['load_s'] / staged['checks_s']:.1f}x, "
                  f"e2e/checks {end['e2e_s'] / staged['checks_s']:.1f}x")


if __name__ == "__main__":
    main()
