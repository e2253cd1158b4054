"""`nanscope hazards`: the hazard catalogue pushed through slime v0.1.0's loss (and the fix).

No model, no processes: each hazard's micro-batch is built against a synthetic policy with a
realistic logit scale and its loss is differentiated w.r.t. the logits. Runs in seconds on a laptop.
"""

from __future__ import annotations

import argparse
import json

EPILOG = """examples:
  nanscope hazards                       # as-is: which hazards give a NaN loss / NaN gradient
  nanscope hazards --loss safe           # the fix on the same batches
  nanscope hazards --json hazards.json
"""


def add_parser(sub):
    p = sub.add_parser(
        "hazards",
        help="the hazard catalogue through slime v0.1.0's loss",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--loss", choices=("as-is", "safe"), default="as-is", help="which loss (default: as-is)")
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    p.add_argument("--seed", type=int, default=0)
    return p


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from nanscope import hazards

    outcomes = [hazards.run_loss(h.name, args.loss, seed=args.seed) for h in hazards.CATALOGUE]
    table = Table(title=f"hazards through the {args.loss} loss (case slime-795 flags)")
    for col in ("hazard", "loss finite", "grad finite", "non-finite grad entries", "expected (as-is)"):
        table.add_column(col, no_wrap=(col == "hazard"))
    for o in outcomes:
        h = hazards.get(o.name)
        table.add_row(
            o.name,
            _yes(o.loss_finite),
            _yes(o.grad_finite),
            str(o.nan_grad_entries),
            f"loss {'finite' if h.loss_finite else 'NaN'}, grad {'finite' if h.grad_finite else 'NaN'}",
        )
    console = Console()
    console.print(table)
    for o in outcomes:
        console.print(f"[bold]{o.name}[/]: {o.mechanism}")
    if args.json:
        doc = {
            "loss": args.loss,
            "hazards": [
                {
                    "name": o.name,
                    "mechanism": o.mechanism,
                    "loss_finite": o.loss_finite,
                    "grad_finite": o.grad_finite,
                    "nan_grad_entries": o.nan_grad_entries,
                }
                for o in outcomes
            ],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


def _yes(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"
