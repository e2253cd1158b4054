"""`nanscope scan` on a generated case-sized dump: end to end, the checks alone, and torch.load alone.

A case-sized rollout is 512 samples (64 prompts x 8). By default their lengths are uniform, prompts of
512-4,096 tokens and responses of 1-61,440 (--rollout-max-response-len of the case), about 17M tokens;
with --full every sample has the case's whole 65,536-token context (4,096 + 61,440), 33.5M tokens. The
rollout dump is written as slime v0.1.0 writes it (Python lists inside torch.save); the train dump as its
actor does (tensors, cp=1). Each phase runs in a fresh child process, side by side in one run, so its
time and peak RSS (VmHWM) are its own:

    torch.load   torch.load(weights_only=True) of the file alone (what scan used before)
    unpickler    nanscope's restricted unpickler alone (dumps/unpickler.py: the whole file, no checks)
    C unpickler  pickle.Unpickler with find_class limited to the same globals (the route issue 13 proposed;
                 not shipped: it is not a subset of weights_only, see tests/dumps/test_unpickler.py)
    checks       every check on samples already converted
    e2e          `nanscope scan FILE --json ...` as a user runs it, wall clock from exec to exit (interpreter
                 start and imports included), the exit code and the process's peak RSS
    directory    `nanscope scan DIR --json ...` over both dumps, one worker per core, wall clock

Every phase but torch.load (minutes) is timed twice and the faster run kept: the box may be shared.

    python benchmarks/scan_throughput.py --dir /tmp/scan-bench          # case-sized, uniform lengths
    python benchmarks/scan_throughput.py --dir /tmp/scan-full --full    # every sample 65,536 tokens
    python benchmarks/scan_throughput.py --quick                        # seconds
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

# Peak RSS of the process itself: VmHWM starts afresh at exec (ru_maxrss would inherit the parent's peak).
HWM = (
    "def hwm():\n"
    "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024\n"
)

PHASES = {
    "torch.load": """
import warnings, torch
warnings.simplefilter("ignore")
t0 = time.perf_counter()
torch.load(path, map_location="cpu", weights_only=True)
out = {"s": time.perf_counter() - t0}
""",
    "unpickler": """
import torch
from nanscope.dumps.unpickler import Loader
t0 = time.perf_counter()
Loader.open(path).load()
out = {"s": time.perf_counter() - t0}
""",
    "C unpickler": """
import io, pickle, torch
from nanscope.dumps.unpickler import _allowed
allowed = _allowed()

class Restricted(pickle.Unpickler):  # the route issue 13 proposed: find_class limited to the same globals
    def find_class(self, module, name):
        if f"{module}.{name}" not in allowed:
            raise pickle.UnpicklingError(f"{module}.{name}")
        return allowed[f"{module}.{name}"]

def storage(pid):
    _, marker, key, _, numel = pid
    raw = reader.get_storage_from_record(f"data/{key}", numel * torch._utils._element_size(marker.dtype),
                                         torch.UntypedStorage)
    return torch.storage.TypedStorage(wrap_storage=raw._typed_storage()._untyped_storage, dtype=marker.dtype,
                                      _internal=True)

t0 = time.perf_counter()
reader = torch._C.PyTorchFileReader(path)
u = Restricted(io.BytesIO(reader.get_record("data.pkl")))
u.persistent_load = storage
u.load()
out = {"s": time.perf_counter() - t0}
""",
    "checks": """
from nanscope import case
from nanscope.dumps import checks, io
from nanscope.dumps.dump import Dump
from nanscope.dumps.result import hazard_count
dump = io.load(path)
samples = list(dump.samples())
out = {}
for key, hist in (("s", False), ("hist_s", True)):
    staged = Dump.from_samples(path, dump.kind, samples)
    t0 = time.perf_counter()
    result = checks.scan(staged, case.scan_config(histograms=hist))
    out[key] = time.perf_counter() - t0
out["response_tokens"], out["findings"] = result.response_tokens, hazard_count(result)
""",
}


def lengths(n: int, max_total: int, seed: int, full: bool) -> list[tuple[int, int]]:
    """(prompt, response) per sample: uniform in [512, 4096] x [1, max_total - 4096], or all (4096, rest)."""
    import numpy as np

    prompt_hi = min(4096, max_total // 2)
    if full:
        return [(prompt_hi, max_total - prompt_hi)] * n
    rng = np.random.default_rng(seed)
    prompts = rng.integers(min(512, prompt_hi), prompt_hi + 1, n)
    responses = rng.integers(1, max_total - prompt_hi + 1, n)
    return list(zip(prompts.tolist(), responses.tolist()))


def write_dumps(tmp: Path, n: int, max_total: int, seed: int, full: bool) -> None:
    """A rollout dump (lists) and a train dump (tensors) of the same samples, hazards planted in a few."""
    import numpy as np

    from nanscope.dumps import demo, writers

    rng = np.random.default_rng(seed)
    samples = []
    for i, (p, r) in enumerate(lengths(n, max_total, seed, full)):
        s = demo.rollout_sample(i, p, r, reward=float(i % 2), rng=rng, masked_span=(r // 3, r // 2), as_lists=False)
        samples.append(s)
    samples[5]["rollout_log_probs"][0] = float("nan")
    samples[n // 2]["rollout_log_probs"][-1] = -100.0
    train = demo.train_data_from_samples(samples, [0.0] * n)
    writers.write_train_dump(tmp / "train" / "12_0.pt", train, rollout_id=12)
    del train
    for s in samples:  # slime writes plain lists
        for k in ("tokens", "loss_mask", "rollout_log_probs"):
            s[k] = s[k].tolist()
    writers.write_rollout_dump(tmp / "rollout" / "12.pt", samples, rollout_id=12)


def child(code: str, *argv: str) -> dict:
    """Run `code` in a fresh interpreter on 2 threads; it sets `out`; returns out + its peak RSS in MB."""
    script = (
        HWM + "import sys, time, json\npath = sys.argv[1]\n" + code + "\nout['rss_mb'] = hwm()\nprint(json.dumps(out))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    res = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def cli(*argv: str) -> dict:
    """`nanscope ARGV` as a user runs it: wall seconds from exec to exit, exit code, peak RSS in MB."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "nanscope.cli.main", *argv], env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return {"s": time.perf_counter() - t0, "rc": os.waitstatus_to_exitcode(status), "rss_mb": usage.ru_maxrss / 1024}


def best(run, times: int) -> dict:
    """The fastest of `times` runs."""
    return min((run() for _ in range(times)), key=lambda r: r["s"])


def bench_file(name: str, path: Path, skip_torch_load: bool) -> dict:
    phases = [k for k in PHASES if not (skip_torch_load and k == "torch.load")]
    got = {
        phase: best(lambda p=phase: child(PHASES[p], str(path)), 1 if phase == "torch.load" else 2) for phase in phases
    }
    got["e2e"] = best(lambda: cli("scan", str(path), "--json", f"{path}.json", "--no-progress"), 2)
    phases.append("e2e")
    tokens = got["checks"]["response_tokens"]
    rate = lambda s: tokens / s / 1e6  # noqa: E731  M response tokens / s
    print(
        f"{name}: {path.stat().st_size / 2**20:.0f} MiB, {tokens:,} response tokens, "
        f"{got['checks']['findings']} findings, exit {got['e2e']['rc']}"
    )
    for phase in phases:
        extra = f"   (with --html histograms {got['checks']['hist_s']:.2f} s)" if phase == "checks" else ""
        print(
            f"  {phase:<12} {got[phase]['s']:8.2f} s  {rate(got[phase]['s']):8.2f} M tok/s  "
            f"peak RSS {got[phase]['rss_mb']:6.0f} MB{extra}"
        )
    e2e, checks = got["e2e"]["s"], got["checks"]["s"]
    line = f"  ratios     e2e/checks {e2e / checks:.1f}x"
    if "torch.load" in got:
        line += (
            f", torch.load/e2e {got['torch.load']['s'] / e2e:.1f}x, "
            f"torch.load/unpickler {got['torch.load']['s'] / got['unpickler']['s']:.1f}x, "
            f"C unpickler/unpickler {got['C unpickler']['s'] / got['unpickler']['s']:.1f}x"
        )
    print(line)
    return got


def bench_directory(tmp: Path) -> None:
    got = best(lambda: cli("scan", str(tmp), "--json", str(tmp / "scan.json"), "--no-progress"), 2)
    print(
        f"directory: nanscope scan {tmp} (both dumps, {len(os.sched_getaffinity(0))} workers): {got['s']:.2f} s, "
        f"exit {got['rc']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--max-total", type=int, default=65536)
    ap.add_argument("--full", action="store_true", help="every sample the whole --max-total context")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="64 samples of up to 8,192 tokens")
    ap.add_argument("--dir", help="keep the generated dumps here and reuse them on the next run")
    ap.add_argument("--skip-torch-load", action="store_true", help="leave out the minutes-long torch.load phase")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.samples, args.max_total = 64, 8192
    if args.generate_only:
        write_dumps(Path(args.dir), args.samples, args.max_total, args.seed, args.full)
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.dir or d)
        rollout, train = tmp / "rollout" / "12.pt", tmp / "train" / "12_0.pt"
        if not (rollout.exists() and train.exists()):
            t0 = time.perf_counter()
            # In a child, so this process stays small (children's peak RSS is measured apart anyway).
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--generate-only",
                    "--dir",
                    str(tmp),
                    "--samples",
                    str(args.samples),
                    "--max-total",
                    str(args.max_total),
                    "--seed",
                    str(args.seed),
                ]
                + ["--full"] * args.full,
                check=True,
            )
            print(f"generated in {time.perf_counter() - t0:.0f} s")
        tokens = sum(p + r for p, r in lengths(args.samples, args.max_total, args.seed, args.full))
        print(
            f"{args.samples} samples, {tokens:,} tokens; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        for name, path in (("rollout (lists)", rollout), ("train (tensors)", train)):
            bench_file(name, path, args.skip_torch_load)
        bench_directory(tmp)


if __name__ == "__main__":
    main()
