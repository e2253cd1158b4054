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

The runs are the verl tests' (tests/verl/harness.py: each rank a subprocess, the CPU stand-ins of
tests/verl/standins.py, each naming what it replaces, the mini-batch of tests/verl/data.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.verl.harness

from tests.verl import harness  # noqa: E402
from tests.verl.harness import Spec  # noqa: E402

VARIANTS = {
    "none": (None, "vanilla"),
    "plugin": ("external_lib", "vanilla"),
    "plugin+loss": ("external_lib", "nanscope"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = harness.tiny_qwen3(root / "model")
        results: dict[str, list] = {}
        for round_ in range(args.rounds):
            for variant in args.variants.split(","):
                install, loss_mode = VARIANTS[variant]
                env = {"NANSCOPE_REPORT_DIR": os.path.join(tmp, "reports")} if install else {}
                spec = Spec(install=install, loss_mode=loss_mode, steps=args.steps, env=env)
                ranks = harness.run(spec, root, model, name=f"{variant}-{round_}", timeout=600)
                assert all(r.error is None for r in ranks), [r.error for r in ranks]
                results.setdefault(variant, []).append(ranks[0])
        _print(results)


def _print(results: dict) -> None:
    base = results.get("none", [None])[0]
    print("| variant | engine | update_actor wall, median of steps 2.. (rounds) | CPU, rank 0 (rounds) | CPU vs none "
          "| parameters vs none |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    ref = None
    for variant, runs in results.items():
        medians = [statistics.median(r.seconds[1:]) for r in runs]
        median = statistics.median(medians)
        cpus = [statistics.median(r.cpu[1:]) for r in runs]
        cpu = statistics.median(cpus)
        ref = cpu if variant == "none" else ref
        same = "-" if base is None or variant == "none" else (
            "bitwise equal" if all(torch.equal(runs[0].after[k], v) for k, v in base.after.items()) else "differ"
        )  # fmt: skip
        ratio = f"{cpu / ref:.3f}x" if ref else "-"
        shown = ", ".join(f"{m * 1000:.0f}" for m in medians)
        shown_cpu = ", ".join(f"{m * 1000:.0f}" for m in cpus)
        engine = runs[0].engine.rsplit(".", 1)[-1]
        print(f"| {variant} | {engine} | {median * 1000:.0f} ms ({shown}) | {cpu * 1000:.0f} ms ({shown_cpu}) "
              f"| {ratio} | {same} |")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
