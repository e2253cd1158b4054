"""`nanscope repro --natural` over seeds: the step at which training itself kills the as-is run, and the time to it.

Runs on a laptop CPU (no GPU), about 1 to 3 minutes a seed on 2 cores:

    python benchmarks/natural.py                         # seeds 0-9, lr 1e-3, at most 60 steps each
    python benchmarks/natural.py --seeds 0-4 --lr 2e-3 --steps 40 --json natural.json

Per seed, one launch of the harness with the natural loop's as-is run only (the plugin run trains the same steps
up to the death, `repro --natural` checks it: `same_until_death`), measured from the launch to the rank's exit:
  - the death step (megatron-core's bucket check), and which exp crossed 88.72 first, on which kind of token;
  - the wall seconds of the launch (its start-up included) and the CPU seconds of its whole process tree, with the
    load average before and after (the box is shared: the CPU seconds are the steadier figure);
  - the plugin's warning rule at its default thresholds (`slime_plugin.logs.warnings_for`, 20 and 60) applied to
    each step's measured headroom: the first step it warns at, the first step above 60, and the lead over the death.
Then the distribution: the median, quartiles and range of the death step and of the time to it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time


def seeds_of(text: str) -> list[int]:
    """`0-9` or `0,3,5` -> the seeds."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def warned(series: list[dict]) -> tuple[int | None, int | None]:
    """(the first step the plugin's rule warns at, the first step above its high threshold), from the headroom."""
    from nanscope.slime_plugin.logs import warnings_for  # heavy: the plugin's package imports torch
    from nanscope.slime_plugin.settings import Settings

    settings = Settings()
    first = high = None
    for entry in series:
        names = ("max_kl_log_ratio", "max_ppo_log_ratio", "max_tis_log_ratio", "train_rollout_gap_max")
        metrics = {f"nanscope/{name}": entry[name] for name in names}
        crossed = warnings_for(metrics, {}, settings)
        if crossed and first is None:
            first = entry["step"]
        top = max(entry[name] for name in ("max_kl_log_ratio", "max_ppo_log_ratio", "max_tis_log_ratio"))
        if top > settings.warn_log_ratio[1] and high is None:
            high = entry["step"]
    return first, high


def one(seed: int, steps: int, lr: float) -> dict:
    """The as-is run of the natural loop for one seed: death step, crossing, wall and CPU seconds, warnings."""
    from nanscope import case, natural  # the parent's imports: no torch
    from nanscope.megatron import launcher
    from nanscope.megatron.spec import Layout, RunSpec
    from nanscope.repro import from_run

    layout = Layout(cp=1)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    launched = launcher.launch([RunSpec(natural=True, seed=seed, steps=steps, lr=lr)], layout,
                               loss_flags=case.loss_flags(), timeout_s=3600, rank_timeout_s=300)  # fmt: skip
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rep = from_run(launched.runs[0], launched, layout, expected="nan-check")
    died = min((r.error_step for r in rep.ranks if not r.ok), default=None)
    series = natural.series_of(rep)
    found = natural.crossing(series) or {}
    first, high = warned(series)
    return {
        "seed": seed,
        "died_at_step": died,
        "observed": rep.observed,
        "frames_match_case": rep.frames_match_case,
        "crossing": {k: found.get(k) for k in ("exp", "step", "sample", "token", "masked", "span", "log_ratio")},
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "first_warned_step": first,
        "first_step_above_60": high,
        "lead": None if died is None or first is None else died - first,
        "max_kl_log_ratio": [round(e["max_kl_log_ratio"], 2) for e in series],
        "entropy": [round(e["entropy"], 3) for e in series],
        "reward": [round(e["reward"], 3) for e in series],
    }


def quartiles(values: list[float]) -> str:
    if not values:
        return "none"
    if len(values) < 2:
        return f"{values[0]:g}"
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"median {q2:g} (quartiles {q1:g}-{q3:g}, range {min(values):g}-{max(values):g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,3,5 (default 0-9)")
    parser.add_argument("--steps", type=int, default=60, help="the most steps a seed runs (default 60)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default 1e-3, repro's)")
    parser.add_argument("--json", help="also write every seed's figures here")
    args = parser.parse_args()
    rows = []
    print("| seed | died at step | first exp past 88.72 | wall s | CPU s | load before/after | warned at | "
          "first > 60 | lead |")  # fmt: skip
    print("|---:|---:|---|---:|---:|---|---:|---:|---:|")
    for seed in seeds_of(args.seeds):
        row = one(seed, args.steps, args.lr)
        rows.append(row)
        c = row["crossing"]
        kind = f"{c['exp']}, {'masked tool token' if c['masked'] else 'trained token'}" if c.get("exp") else "-"
        died = row["died_at_step"] or ("no death" if row["observed"] == "completed" else f"launch {row['observed']}")
        print(f"| {seed} | {died} | {kind} | {row['wall_s']} | {row['cpu_s']} | "
              f"{row['load_before']}/{row['load_after']} | {row['first_warned_step']} | "
              f"{row['first_step_above_60']} | {row['lead']} |", flush=True)  # fmt: skip
    dead = [row for row in rows if row["died_at_step"]]
    # a launch that never ran its steps (rendezvous or start-up past its bound on an overloaded box) says nothing
    failed = [row["seed"] for row in rows if row["observed"] not in ("nan-check", "completed")]
    print(f"\nlr {args.lr:g}, at most {args.steps} steps: {len(dead)}/{len(rows) - len(failed)} seeds died"
          + (f" (launches that did not run, left out: seeds {failed})" if failed else ""))  # fmt: skip
    print("death step:", quartiles([row["died_at_step"] for row in dead]))
    print("wall s to the death:", quartiles([row["wall_s"] for row in dead]))
    print("CPU s to the death:", quartiles([row["cpu_s"] for row in dead]))
    print("lead of the first warning:", quartiles([row["lead"] for row in dead if row["lead"] is not None]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"lr": args.lr, "steps": args.steps, "seeds": rows}, f, indent=1)


if __name__ == "__main__":
    main()
