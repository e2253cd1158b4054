"""verl_step: what nanscope.verl_plugin adds to a healthy actor update, side by side with verl alone.

Runs verl v0.9.0's own `ActorRolloutRefWorker(role="actor").init_model()` and `update_actor()` on 2 gloo ranks on
CPU (FSDP2, fp32, a tiny Qwen3 built from a config: 2 layers, hidden 64, vocab 128), once per variant:

    none         verl alone
    plugin       actor_rollout_ref.model.external_lib=nanscope.verl_plugin (engine subclass: cleaning, sentinel,
                 vote), loss_mode vanilla
    plugin+loss  the same with actor.policy_loss.loss_mode=nanscope (inner vanilla)

and reports each variant's median wall time of one update_actor on rank 0 (after the first, which warms up) and
the final parameters' equality with `none`'s (healthy steps: bitwise equal, or the plugin changed the step).

Needs the verl environment (verl 0.9.0, its runtime dependencies, einops); run from the repository root:
    PYTHONPATH=src python benchmarks/verl_step.py --steps 8

The worker, its CPU stand-ins (each naming what it replaces) and the mini-batch are tests/verl_plugin/worker.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.verl_plugin.worker

from tests.verl_plugin import worker  # noqa: E402

VARIANTS = {"none": (False, "vanilla"), "plugin": (True, "vanilla"), "plugin+loss": (True, "nanscope")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    os.environ.pop("VERL_USE_EXTERNAL_MODULES", None)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        worker.tiny_model(model)
        results: dict[str, list] = {}
        for round_ in range(args.rounds):
            for i, variant in enumerate(args.variants.split(",")):
                plugin, loss_mode = VARIANTS[variant]
                out = os.path.join(tmp, variant)
                spec = {"out": out, "model": model, "port": 29600 + 10 * round_ + i, "plugin": plugin,
                        "loss_mode": loss_mode, "steps": args.steps,
                        "env": {"NANSCOPE_REPORT_DIR": os.path.join(tmp, "reports")}}  # fmt: skip
                mp.spawn(worker.run, args=(spec,), nprocs=2)
                with open(out + ".rank0.json") as f:
                    run = json.load(f)
                run["params"] = torch.load(out + ".params.pt")
                results.setdefault(variant, []).append(run)
        _print(results)


def _print(results: dict) -> None:
    base = results.get("none", [None])[0]
    print("| variant | engine | update_actor wall, median of steps 2.. (rounds) | CPU, rank 0 (rounds) | CPU vs none "
          "| parameters vs none |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    ref = None
    for variant, runs in results.items():
        medians = [statistics.median(r["seconds"][1:]) for r in runs]
        median = statistics.median(medians)
        cpus = [statistics.median(r["cpu"][1:]) for r in runs]
        cpu = statistics.median(cpus)
        ref = cpu if variant == "none" else ref
        same = "-" if base is None or variant == "none" else (
            "bitwise equal" if all(torch.equal(runs[0]["params"][k], v) for k, v in base["params"].items())
            else "differ"
        )  # fmt: skip
        ratio = f"{cpu / ref:.3f}x" if ref else "-"
        shown = ", ".join(f"{m * 1000:.0f}" for m in medians)
        shown_cpu = ", ".join(f"{m * 1000:.0f}" for m in cpus)
        print(f"| {variant} | {runs[0]['engine']} | {median * 1000:.0f} ms ({shown}) | {cpu * 1000:.0f} ms ({shown_cpu}) "
              f"| {ratio} | {same} |")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
