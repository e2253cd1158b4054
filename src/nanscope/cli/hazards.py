"""`nanscope hazards`: the hazard catalogue pushed through slime v0.1.0's loss (and the fix).

No model, no processes: each batch hazard's micro-batch is built against a synthetic policy with a
realistic logit scale and its loss is differentiated w.r.t. the logits. Runs in seconds on a laptop.
Faults in the model are listed with their fault spec (`nanscope repro --hazard NAME` runs them), and
the causes slime v0.1.0 is immune to with the release's file:line that shows it.
"""

from __future__ import annotations

from nanscope import case
from nanscope.causes import catalogue, immune
from nanscope.cli import help, numbers, terminal
from nanscope.loss import NAMES as LOSS_NAMES
from nanscope.report import files

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
        formatter_class=help.Formatter,
    )
    p.add_argument("--loss", choices=LOSS_NAMES, default="as-is", help="which loss (default: as-is)")
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    p.add_argument("--seed", type=numbers.SEED, default=0, help="seed of the batches, 0..2^32-1 (default 0)")
    return p


def run(args) -> int:
    from nanscope import hazards  # heavy: torch
    from nanscope.report import hazards as report  # heavy: rich

    files.check_outputs({"--json": args.json})
    listed = catalogue.CATALOGUE
    flags = case.loss_flags()
    outcomes = [hazards.run_loss(h.name, args.loss, flags=flags, seed=args.seed) for h in listed if h.level == "batch"]
    model_level = tuple(h for h in listed if h.level == "model")
    report.render(outcomes, args.loss, terminal.console(), model_level, immune.IMMUNE)
    if args.json:
        files.write_json(args.json, report.to_json(outcomes, args.loss, model_level, immune.IMMUNE))
    return 0
