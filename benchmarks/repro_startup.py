"""Where the time of `nanscope repro --hazard healthy` goes: startup (imports, process group) vs the step.

Runs on a laptop CPU (no GPU), about 3 minutes on 2 cores:

    python benchmarks/repro_startup.py            # prints a table
    python benchmarks/repro_startup.py --runs 10  # the marginal run cost from a 10-run launch

Measured side by side in one invocation:
  1. `import megatron.core` + the model builders in ONE process (no contention);
  2. one torchrun launch with 1 healthy run (what `nanscope repro --hazard healthy` does), split into
     the ranks' own imports / process-group init, the run, and the rest (torchrun, teardown);
  3. one launch with N healthy runs: (wall_N - wall_1) / (N - 1) is the marginal cost of a run when
     the process group is reused, which is how the launcher executes a matrix.
The projected matrix (every hazard x {as-is, safe}) is startup + runs x marginal run cost.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def single_process_import_s() -> float:
    code = "import time; t=time.time(); import megatron.core.models.gpt, megatron.core.distributed, megatron.core.optimizer, megatron.core.pipeline_parallel; print(time.time()-t)"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def launch_healthy(n: int) -> dict:
    """Phases of one launch of `n` healthy runs, in seconds (slowest rank for the rank-side ones)."""
    from nanscope.megatron.launcher import launch
    from nanscope.megatron.spec import RunSpec

    res = launch([RunSpec("healthy", seed=0) for _ in range(n)], timeout_s=900)
    assert res.ok and all(r.observed == "completed" for r in res.runs), res.stderr_tail
    spawn = max(s["started"] for s in res.startup.values()) - res.launched_at
    imports = max(s["imports_s"] for s in res.startup.values())
    init = max(s["init_s"] for s in res.startup.values())
    runs = [max(k.seconds for k in r.ranks) for r in res.runs]
    rest = res.wall_s - spawn - imports - init - sum(runs)
    return {"wall": res.wall_s, "spawn": spawn, "imports": imports, "init": init, "runs": runs, "rest": rest}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="healthy runs in the multi-run launch (default 5)")
    p.add_argument(
        "--matrix", type=int, default=10, help="runs in the projected matrix (default 10: 5 hazards x 2 losses)"
    )
    a = p.parse_args(argv)

    load = os.getloadavg()[0]
    alone = single_process_import_s()
    one = launch_healthy(1)
    many = launch_healthy(a.runs)
    marginal = sum(many["runs"][1:]) / (a.runs - 1)  # the first run of a launch pays one-off warm-up
    fixed = one["wall"] - one["runs"][0]
    w = one["wall"]
    print(f"cores {os.cpu_count()}, load average at start {load:.1f}")
    print(f"import megatron-core, 1 process alone            {alone:6.1f} s")
    print(f"nanscope repro --hazard healthy (1 launch, 1 run) {w:6.1f} s wall")
    for name, key in (
        ("torchrun spawn -> worker entry", "spawn"),
        ("imports in the ranks (4 on 2 cores)", "imports"),
        ("process group + parallel state", "init"),
    ):
        print(f"  {name:<44}{one[key]:6.1f} s  ({one[key] / w:4.0%})")
    print(f"  {'the run (build, log-prob pass, step)':<44}{one['runs'][0]:6.1f} s  ({one['runs'][0] / w:4.0%})")
    print(f"  {'teardown (barrier, exit, torchrun)':<44}{one['rest']:6.1f} s  ({one['rest'] / w:4.0%})")
    print(
        f"{a.runs} healthy runs in one launch: wall {many['wall']:.1f} s; runs {', '.join(f'{r:.1f}' for r in many['runs'])} s"
    )
    print(f"marginal run (runs 2..{a.runs})                       {marginal:6.1f} s")
    print(
        f"projected matrix, {a.matrix} runs in one launch         {fixed + a.matrix * marginal:6.1f} s  "
        f"(vs {a.matrix * w:.0f} s as {a.matrix} launches: startup is {fixed / w:.0%} of a single repro)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
