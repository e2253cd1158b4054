"""What `nanscope repro` (the matrix) costs against one plain training step, and where its time goes.

Runs on a laptop CPU (no GPU), about 2 minutes a round on 2 cores:

    python benchmarks/repro_startup.py                        # 2 rounds
    python benchmarks/repro_startup.py --rounds 3 --against aae1731

Measured side by side in one invocation (medians over rounds; the commands of a round run in rotating
order, so none always goes first):
  1. one plain training step: `nanscope repro --hazard healthy` from exec to exit, i.e. one launch of the
     4 CPU ranks (TP2 x PP2) with one run of one optimizer step, the parent's imports and report included;
  2. the matrix: `nanscope repro` from exec to exit (the case's hazards and healthy x {as-is, safe}, one
     launch), and `nanscope repro --all` (every hazard of the catalogue);
  3. with --against REF: the matrix of git revision REF (its src/ exported to a temp dir and put first
     on PYTHONPATH, so the parent and every rank import it), the before/after figure;
  4. megatron-core's import in a fresh process, plain vs through `bootstrap.import_megatron`
     (torch.compile deferred to a first call).
Wall seconds and the CPU seconds of each command's whole process tree (the steadier figure on a shared
box). Then one matrix launch in this process (`repro.run_matrix`) for the breakdown: the launch's fixed
cost (the agent's imports, fork, process groups, exit) vs its runs (the first pays one-off warm-up; the
others share the first-step log-prob pass, `run.Runner.policy`).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

IMPORT = (
    "import sys, time; t = time.time(); {prelude}import megatron.core.models.gpt, megatron.core.distributed, "
    "megatron.core.optimizer, megatron.core.pipeline_parallel, torch._dynamo; print(time.time() - t)"
)  # torch._dynamo: the first optimizer imports it either way
DEFERRED = "from nanscope.megatron import bootstrap; bootstrap.import_megatron(); "
ROOT = Path(__file__).resolve().parent.parent


def import_s(prelude: str) -> float:
    """Seconds to import megatron-core (what the harness uses) in a fresh process."""
    code = IMPORT.format(prelude=prelude)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def export(ref: str) -> str:
    """src/ of git revision `ref` in a temp dir; returns the directory to put on PYTHONPATH."""
    dest = Path(tempfile.mkdtemp(prefix="nanscope-ref-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True).stdout
    tar = dest / "src.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    return str(dest / "src")


def nanscope(*args: str, path: str | None = None) -> tuple[float, float, int]:
    """(seconds from exec to exit, CPU seconds of its whole process tree, exit code) of `nanscope ARGS`;
    `path` first on PYTHONPATH (another revision's src/)."""
    cmd = [sys.executable, "-c", "import sys; from nanscope.cli.main import main; sys.exit(main())", *args]
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, proc.returncode


def breakdown() -> dict:
    """One matrix launch in this process: its wall, the agent's imports, and per-run seconds (slowest rank)."""
    from nanscope import repro
    from nanscope.megatron import launcher

    seen = {}
    launch = launcher.launch

    def keep(*args, **kwargs):  # the launch's startup records, which run_matrix does not return
        seen["result"] = launch(*args, **kwargs)
        return seen["result"]

    launcher.launch = keep
    try:
        m = repro.run_matrix(timeout_s=900)
    finally:
        launcher.launch = launch
    runs = [max(r.seconds for r in rep.ranks) for row in m.rows for rep in (row.as_is, row.safe)]
    startup = seen["result"].startup
    return {
        "wall": m.wall_s,
        "runs": runs,
        "ok": m.ok,
        "imports": max(s["imports_s"] for s in startup.values()),
        "init": max(s["init_s"] for s in startup.values()),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of (one step, matrix[, REF's matrix]) (default 2)")
    p.add_argument("--against", metavar="REF", help="also the matrix of git revision REF, in the same rounds")
    a = p.parse_args(argv)

    load = os.getloadavg()[0]
    commands = {
        "one": (("repro", "--hazard", "healthy"), None),
        "matrix": (("repro",), None),  # the case's hazards and healthy (the default)
        "matrix --all": (("repro", "--all"), None),  # the whole catalogue: issue 30's figure
    }
    if a.against:
        commands[f"matrix at {a.against}"] = (("repro",), export(a.against))
    imports = [(import_s(""), import_s(DEFERRED)) for _ in range(a.rounds)]
    wall = {name: [] for name in commands}
    cpu = {name: [] for name in commands}
    names = list(commands)
    for i in range(a.rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            args, path = commands[name]
            s, c, code = nanscope(*args, path=path)
            assert code == 0, f"nanscope {' '.join(args)} ({name}) exited {code}"
            wall[name].append(s)
            cpu[name].append(c)
    b = breakdown()
    med = statistics.median
    print(
        f"cores {os.cpu_count()}, load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end; {a.rounds} rounds"
    )
    print(f"import megatron-core, 1 process: plain {med(x for x, _ in imports):.2f} s, torch.compile deferred "
          f"{med(y for _, y in imports):.2f} s")  # fmt: skip
    for name in names:
        print(f"{name:24s} wall {med(wall[name]):5.1f} s (rounds: {_list(wall[name])}), "
              f"CPU {med(cpu[name]):5.1f} s (rounds: {_list(cpu[name])})")  # fmt: skip
    for name in names[1:]:
        ratio = [m / o for m, o in zip(wall[name], wall["one"])]
        print(f"  {name} / one step: wall {med(ratio):.2f}x (per round: {_list(ratio, 2)}), "
              f"CPU {med(cpu[name]) / med(cpu['one']):.2f}x")  # fmt: skip
    if a.against:
        ratio = [m / r for m, r in zip(wall["matrix"], wall[names[3]])]
        print(f"  matrix / {names[3]}: wall {med(ratio):.2f}x (per round: {_list(ratio, 2)}), "
              f"CPU {med(cpu['matrix']) / med(cpu[names[3]]):.2f}x")  # fmt: skip
    runs, total = b["runs"], b["wall"]
    fixed = total - sum(runs)
    print(f"breakdown of one matrix launch ({'ok' if b['ok'] else 'NOT ok'}): wall {total:.1f} s")
    print(f"  fixed (agent imports {b['imports']:.1f} s, fork, process groups {b['init']:.1f} s, exit) "
          f"{fixed:5.1f} s ({fixed / total:4.0%})")  # fmt: skip
    print(f"  first run (one-off warm-up included)                  {runs[0]:5.1f} s")
    print(f"  other runs: {len(runs) - 1} x median {med(runs[1:]):.2f} s            {sum(runs[1:]):5.1f} s")
    return 0


def _list(xs, digits: int = 1) -> str:
    return ", ".join(f"{x:.{digits}f}" for x in xs)


if __name__ == "__main__":
    sys.exit(main())
