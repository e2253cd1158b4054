"""What `nanscope repro` (the matrix) costs against one plain training step, and where its time goes.

Runs on a laptop CPU (no GPU), about 2 minutes on 2 cores:

    python benchmarks/repro_startup.py              # 2 rounds
    python benchmarks/repro_startup.py --rounds 3

Measured side by side in one invocation (medians over rounds; each round runs 1 then 2, alternating
which goes first):
  1. one plain training step: `nanscope repro --hazard healthy` from exec to exit, i.e. one torchrun
     launch of the 4 CPU ranks (TP2 x PP2) with one run of one optimizer step, the parent's imports
     and report included;
  2. the matrix: `nanscope repro` from exec to exit (every hazard x {as-is, safe}, one launch);
  3. megatron-core's import in a fresh process, plain vs through `bootstrap.import_megatron`
     (torch.compile deferred to a first call).
Then one matrix launch in this process (`repro.run_matrix`) for the breakdown: the launch's fixed
cost (torchrun, imports in 4 ranks on 2 cores, process group, teardown) vs its runs (the first pays
one-off warm-up; the others share the first-step log-prob pass, `worker.Worker.policy`).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

IMPORT = (
    "import sys, time; t = time.time(); {prelude}import megatron.core.models.gpt, megatron.core.distributed, "
    "megatron.core.optimizer, megatron.core.pipeline_parallel, torch._dynamo; print(time.time() - t)"
)  # torch._dynamo: the first optimizer imports it either way
DEFERRED = "from nanscope.megatron import bootstrap; bootstrap.import_megatron(); "


def import_s(prelude: str) -> float:
    """Seconds to import megatron-core (what the harness uses) in a fresh process."""
    code = IMPORT.format(prelude=prelude)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def nanscope(*args: str) -> tuple[float, float, int]:
    """(seconds from exec to exit, CPU seconds of its whole process tree, exit code) of `nanscope ARGS`."""
    cmd = [sys.executable, "-c", "import sys; from nanscope.cli.main import main; sys.exit(main())", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, proc.returncode


def breakdown() -> dict:
    """One matrix launch in this process: its wall and per-run seconds (slowest rank)."""
    from nanscope import repro

    m = repro.run_matrix(timeout_s=900)
    runs = [max(r.seconds for r in rep.ranks) for row in m.rows for rep in (row.as_is, row.safe)]
    return {"wall": m.wall_s, "runs": runs, "ok": m.ok}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of (one step, matrix) end to end (default 2)")
    a = p.parse_args(argv)

    load = os.getloadavg()[0]
    imports = [(import_s(""), import_s(DEFERRED)) for _ in range(a.rounds)]
    one, matrix, cpu = [], [], {"one": [], "matrix": []}
    for i in range(a.rounds):
        pair = [("one", ("repro", "--hazard", "healthy")), ("matrix", ("repro",))]
        for name, args in pair if i % 2 == 0 else pair[::-1]:
            s, c, code = nanscope(*args)
            assert code == 0, f"nanscope {' '.join(args)} exited {code}"
            (one if name == "one" else matrix).append(s)
            cpu[name].append(c)
    b = breakdown()
    med = statistics.median
    plain, deferred = med(x for x, _ in imports), med(y for _, y in imports)
    runs, wall = b["runs"], b["wall"]
    fixed = wall - sum(runs)
    print(
        f"cores {os.cpu_count()}, load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end; {a.rounds} rounds"
    )
    print(f"import megatron-core, 1 process: plain {plain:.2f} s, torch.compile deferred {deferred:.2f} s")
    print(f"one plain training step (nanscope repro --hazard healthy) {med(one):6.1f} s  (rounds: {_list(one)})")
    print(f"the matrix, {len(runs)} runs (nanscope repro)            {med(matrix):6.1f} s  (rounds: {_list(matrix)})")
    print(f"  matrix / one step: {med(matrix) / med(one):.2f}x")
    print(
        f"CPU seconds (every process): one step {med(cpu['one']):.1f}, matrix {med(cpu['matrix']):.1f}; "
        f"on {os.cpu_count()} idle cores the matrix needs at least {med(cpu['matrix']) / os.cpu_count():.1f} s"
    )
    print(f"breakdown of one matrix launch ({'ok' if b['ok'] else 'NOT ok'}): wall {wall:.1f} s")
    print(f"  fixed (torchrun, rank imports, process group, teardown) {fixed:5.1f} s ({fixed / wall:4.0%})")
    print(f"  first run (one-off warm-up included)                  {runs[0]:5.1f} s")
    print(f"  other runs: {len(runs) - 1} x median {med(runs[1:]):.2f} s            {sum(runs[1:]):5.1f} s")
    return 0


def _list(xs) -> str:
    return ", ".join(f"{x:.1f}" for x in xs)


if __name__ == "__main__":
    sys.exit(main())
