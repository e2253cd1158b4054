"""`nanscope repro`: reproduce a hazard's outcome through real megatron-core on CPU (4 processes, gloo).

One torchrun launch of the tiny Qwen3-MoE at TP2 x PP2 with sequence parallelism: the hazard's batch
is built against the model (slime's log-prob pass), one slime train_one_step runs through the 1F1B
schedule, finalize_model_grads and the DDP bucket NaN check, then the optimizer step.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

EPILOG = """\
examples:
  nanscope repro --hazard kl-exp-overflow --loss as-is
  nanscope repro --hazard healthy --json healthy.json

exit code: 0 when the observed outcome is the expected one (the hazard's NaN check under the as-is
loss; a completed step for healthy or under the safe loss), 1 otherwise, 2 for bad input.
"""


def add_parser(sub):
    p = sub.add_parser(
        "repro",
        help="reproduce a hazard through real megatron-core on CPU",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hazard", required=True, metavar="NAME", help="a hazard of the catalogue, or healthy")
    p.add_argument("--loss", default="as-is", choices=("as-is", "safe"), help="slime v0.1.0's loss or nanscope's fix")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    p.add_argument("--seed", type=int, default=0, help="model and batch seed (default 0)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="hard limit for the launch (default 300)")
    return p


@dataclass
class Repro:
    """One hazard x loss through the harness: data only (see `render`, `to_json`)."""

    hazard: str
    loss: str
    expected: str  # "nan-check" | "completed"
    observed: str  # RunResult.observed, or "timeout" / "launch-failed"
    layout: dict
    ranks: list = field(default_factory=list)  # runner.RankRecord
    first_failure: int | None = None
    frames_match_case: bool | None = None  # every failing rank's megatron frames == the case's
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    site: list | None = None  # (sample, response position) the hazard changed, None for healthy
    site_log_probs: dict | None = None  # {"policy", "ref", "rollout"} log-probs at the site

    @property
    def ok(self) -> bool:
        return self.observed == self.expected


def expected_outcome(hazard: str, loss: str) -> str:
    """The as-is loss fails the NaN check exactly when the catalogue says its gradient is not finite."""
    from nanscope import hazards

    if loss == "as-is" and not hazards.get(hazard).grad_finite:
        return "nan-check"
    return "completed"


def repro_one(hazard: str, loss: str = "as-is", *, seed: int = 0, timeout_s: float = 300.0) -> Repro:
    """Run one hazard under one loss through the 4-process harness and compare with the expectation."""
    from nanscope.megatron import runner

    layout = runner.Layout()
    launched = runner.launch([runner.RunSpec(hazard=hazard, loss=loss, seed=seed)], layout, timeout_s=timeout_s)
    run = launched.runs[0]
    observed = run.observed
    if launched.timed_out:
        observed = "timeout"
    failing = [r for r in run.ranks if not r.ok]
    first = run.first_failure()
    notes = [
        f"CPU harness: tp {layout.tp} x pp {layout.pp} x dp {layout.dp}, sequence parallel, 8 experts top-2, gloo",
        f"context parallelism {layout.cp} at the loss level only (zigzag split of each sample's logits); "
        "attention sees whole sequences: CP inside attention needs TransformerEngine",
        "one sample per micro-batch: the local attention spec refuses packed (thd) sequences",
    ]
    for r in run.missing:
        notes.append(f"rank {r}: no record ({launched.stuck.get(r, 'crashed or killed')})")
    if observed in ("incomplete", "timeout", "error"):
        notes.append("torchrun output (tail):\n" + launched.stderr_tail[-3000:])
    return Repro(
        hazard=hazard,
        loss=loss,
        expected=expected_outcome(hazard, loss),
        observed=observed,
        layout={"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "cp_loss_level": layout.cp},
        ranks=run.ranks,
        first_failure=first.rank if first else None,
        frames_match_case=all(tuple(r.frames) == runner.CASE_FRAMES for r in failing) if failing else None,
        wall_s=launched.wall_s,
        notes=notes,
        site=run.ranks[0].hazard_sites[0] if run.ranks and run.ranks[0].hazard_sites else None,
        site_log_probs=run.ranks[0].site_log_probs[0] if run.ranks and run.ranks[0].site_log_probs else None,
    )


def _layers(r) -> str:
    span = f"{r.layers[0]}-{r.layers[-1]}" if r.layers else "-"
    return span + (" + output" if r.holds_output_layer else "")


def _outcome(r) -> str:
    from nanscope.megatron.runner import NAN_CHECK_MESSAGE

    if r.ok:
        return "ok"
    return "NaN check" if (r.error or "").endswith(NAN_CHECK_MESSAGE) else (r.error_type or "error")


def verdict(rep: Repro) -> str:
    """One line: what happened and whether it is what was expected."""
    head = "as expected" if rep.ok else f"UNEXPECTED (expected {rep.expected})"
    if rep.observed == "completed":
        norms = sorted({round(g, 4) for r in rep.ranks for g in r.optimizer_grad_norm if g is not None})
        return f"{head}: {rep.hazard} under the {rep.loss} loss: the step completed on all {len(rep.ranks)} ranks (grad norm {norms})"
    if rep.observed == "nan-check":
        n = sum(not r.ok for r in rep.ranks)
        first = next(r for r in rep.ranks if r.rank == rep.first_failure)
        stage = "last stage" if first.holds_output_layer else "not the last stage"
        frames = "frames match the case's traceback" if rep.frames_match_case else "frames DIFFER from the case's traceback"
        return (
            f"{head}: {rep.hazard} under the {rep.loss} loss fails megatron-core's DDP NaN check on {n}/{len(rep.ranks)} ranks; "
            f"first to raise: rank {first.rank} (pp {first.pp}, {stage}); {frames}"
        )
    return f"{head}: {rep.hazard} under the {rep.loss} loss: {rep.observed}"


def render(rep: Repro, console) -> None:
    """The per-rank table, the first failing rank's frames, notes and the verdict."""
    from rich.table import Table

    table = Table(title=f"nanscope repro --hazard {rep.hazard} --loss {rep.loss}")
    for col in ("rank", "pp", "tp", "layers held", "outcome", "error"):
        table.add_column(col, overflow="fold")
    for r in rep.ranks:
        table.add_row(str(r.rank), str(r.pp), str(r.tp), _layers(r), _outcome(r), r.error or "")
    console.print(table)
    first = next((r for r in rep.ranks if r.rank == rep.first_failure), None)
    if first is not None and first.frames:
        console.print(f"megatron-core frames of rank {first.rank} (case: {'same' if rep.frames_match_case else 'different'}):")
        for name, line, func in first.frames:
            console.print(f"  {name}:{line} in {func}", highlight=False)
    if rep.site is not None:
        where = f"sample {rep.site[0]}" + (f", response token {rep.site[1]}" if rep.site[1] is not None else "")
        lps = ", ".join(f"{k} {v:.2f}" for k, v in (rep.site_log_probs or {}).items())
        console.print(f"hazard site (built against the model's log-prob pass): {where}" + (f": log-probs {lps}" if lps else ""), highlight=False)
    for note in rep.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(verdict(rep), highlight=False)


def to_json(rep: Repro) -> dict:
    """`{"ranks": [{"rank", "pp", "tp", "ok", "error", "grad_norms", ...}], "expected", "observed", ...}`."""
    from nanscope.megatron.runner import CASE_FRAMES

    ranks = [
        {
            "rank": r.rank, "pp": r.pp, "tp": r.tp, "dp": r.dp, "layers": r.layers,
            "holds_output_layer": r.holds_output_layer, "ok": r.ok, "error": r.error,
            "error_time": r.error_time, "grad_norms": r.grad_norms,
            "optimizer_grad_norm": r.optimizer_grad_norm, "params_finite": r.params_finite,
            "losses": r.losses, "frames": [list(f) for f in r.frames],
        }  # fmt: skip
        for r in rep.ranks
    ]
    return {
        "hazard": rep.hazard,
        "loss": rep.loss,
        "expected": rep.expected,
        "observed": rep.observed,
        "ok": rep.ok,
        "layout": rep.layout,
        "first_failure": rep.first_failure,
        "frames_match_case": rep.frames_match_case,
        "case_frames": [list(f) for f in CASE_FRAMES],
        "ranks": ranks,
        "hazard_site": rep.site,
        "site_log_probs": rep.site_log_probs,
        "wall_s": rep.wall_s,
        "notes": rep.notes,
        "verdict": verdict(rep),
    }


def run(args) -> int:
    from rich.console import Console

    from nanscope import hazards
    from nanscope.errors import UserError

    if args.hazard not in hazards.BY_NAME:
        raise UserError(f"--hazard: unknown hazard {args.hazard!r}; known: {', '.join(hazards.BY_NAME)}")
    rep = repro_one(args.hazard, args.loss, seed=args.seed, timeout_s=args.timeout)
    render(rep, Console(width=160))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(rep), f, indent=1)
    return 0 if rep.ok else 1
