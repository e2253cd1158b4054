"""`nanscope trace`: replay one micro-batch's loss and name the op that first produced NaN or inf.

Every aten op of the forward and the backward pass is checked (TorchDispatchMode). The producer is
the first op whose output holds NaN (or +-inf) that none of its inputs held; ops downstream of it
only propagate and are not blamed. For each phase it prints the op, the autograd node (backward),
the source line, and the sample and token of the first bad entry. A non-finite value that no op
produced came from an input: the batch keys that hold one are listed.

Input: a catalogued hazard (built against the synthetic policy, as `nanscope hazards` does) or a
micro-batch file written by nanscope.trace.replay.save_microbatch (batch, logits, args). In a real
slime run the plugin traces the step itself: rerun it with NANSCOPE_TRACE_STEP as its report says.
"""

from __future__ import annotations

import argparse

from nanscope import case
from nanscope.causes import catalogue
from nanscope.errors import UserError
from nanscope.inputs import MiB
from nanscope.loss import NAMES as LOSS_NAMES
from nanscope.report import files
from nanscope.trace import text as render

DEFAULT_LIMIT_MB = 4096  # case-sized logits are several GB (replay.select_samples keeps fewer samples)

EPILOG = """examples:
  nanscope trace --hazard kl-exp-overflow               # exp overflow in low_var_kl, then 0 * inf in its backward
  nanscope trace --hazard nan-reward --loss safe        # the fix on the same batch: no producer
  nanscope trace mb.pt                                  # a file from nanscope.trace.replay.save_microbatch
  nanscope trace --hazard ratio-exp-overflow --json trace.json
"""


def add_parser(sub):
    p = sub.add_parser(
        "trace",
        help="name the op, source line and token that first produced NaN/inf in a replayed loss",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", nargs="?", metavar="FILE.pt", help="a micro-batch file (see nanscope.trace.replay)")
    p.add_argument("--hazard", metavar="NAME", help="replay a catalogued hazard's micro-batch instead of a file")
    p.add_argument("--loss", choices=LOSS_NAMES, help="loss to replay with (default: as-is, or the file's)")
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="OP",
        help="never blame this op (e.g. aten.masked_fill for intentional -inf masks); repeatable",
    )
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON (key 'trace')")
    p.add_argument("--seed", type=int, default=0, help="seed of the hazard's batch (default 0)")
    p.add_argument(
        "--max-input-mb",
        type=float,
        default=DEFAULT_LIMIT_MB,
        metavar="MB",
        help=f"refuse a FILE.pt larger than this (default {DEFAULT_LIMIT_MB})",
    )
    return p


def run(args) -> int:
    from nanscope import hazards  # heavy: torch, which `nanscope --help` never needs
    from nanscope.trace import replay  # heavy: torch

    if (args.file is None) == (args.hazard is None):
        raise UserError("give either FILE.pt or --hazard NAME (not both)")
    if not args.max_input_mb > 0:
        raise UserError(f"--max-input-mb {args.max_input_mb}: must be a number > 0")
    if args.json:
        files.check_writable(args.json)
    site = None
    if args.hazard is not None:
        if args.hazard not in catalogue.BY_NAME:
            raise UserError(f"--hazard {args.hazard}: unknown hazard; known: {', '.join(catalogue.BY_NAME)}")
        if catalogue.get(args.hazard).level == "model":
            raise UserError(
                f"--hazard {args.hazard}: a fault in the model, not in the loss's batch: "
                f"nanscope repro --hazard {args.hazard} --trace"
            )
        flags = case.loss_flags()
        doc, site = hazards.microbatch_document(args.hazard, args.loss or "as-is", flags=flags, seed=args.seed)
        what = f"hazard {args.hazard}"
    else:
        doc = replay.load_microbatch(args.file, int(min(args.max_input_mb * MiB, 2**62)), "--max-input-mb")
        if args.loss:
            doc["loss"] = args.loss
        what = args.file
    try:
        report = replay.replay(doc, allow=tuple(args.allow))
    except ValueError as e:  # the loss refuses the file's args (e.g. an unmodelled advantage estimator)
        raise UserError(f"{what}: the {doc['loss']} loss rejected it: {e}") from None

    print(f"nanscope trace: {what} through the {doc['loss']} loss ({report.ops_seen} aten ops traced)")
    if site is not None:
        token = f", response token {site[1]}" if site[1] is not None else ""
        print(f"hazard site: sample {site[0]}{token}")
    for line in render.lines(report):
        print(line)
    if args.json:
        out = {
            "source": what,
            "loss": doc["loss"],
            "hazard_site": list(site) if site else None,
            "trace": report.to_dict(),
        }
        files.write_json(args.json, out)
    return 0
