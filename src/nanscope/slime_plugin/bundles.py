"""The repro bundle a rank writes on a non-finite step (the format is `nanscope.trace.bundles.bundle`'s).

Which micro-batches: those the sentinel names (the first in forward order and the first in backward order),
and on the last pipeline stage every micro-batch whose loss inputs or loss were non-finite, at most
MAX_MICROBATCHES in all (the sentinel's first, then the others in order: `keep`). For each, what the policy loss
received but the logits, and the current policy's per-token log-probs and entropy the loss watch kept. No
logits: a case-sized micro-batch (16,384 tokens) is well under 2 MB, so a bundle stays under 8 MB.
"""

from __future__ import annotations

import torch

from nanscope import __version__
from nanscope.facts.keys import PER_TOKEN
from nanscope.loss import guard
from nanscope.loss.target import Target
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.loss_watch import Seen
from nanscope.trace.bundles import bundle


def reasons(reading, seen: list[Seen], last_stage: bool) -> dict[int, list[str]]:
    """Micro-batch index -> why it goes into the bundle (`bundle.WHY`), in index order."""
    why: dict[int, list[str]] = {}
    for hit, name in ((reading.forward, "sentinel-forward"), (reading.backward, "sentinel-backward")):
        if hit is None:
            continue
        calls = [mb.index for mb in seen if mb.microbatch == hit.microbatch] or [hit.microbatch]
        for index in calls:  # the loss calls of that micro-batch (several where the harness simulates CP)
            why.setdefault(index, []).append(name)
    if last_stage:
        for mb in seen:
            if _nonfinite_inputs(mb.batch):
                why.setdefault(mb.index, []).append("nonfinite-input")
            if mb.loss is not None and not bool(torch.isfinite(mb.loss).all()):
                why.setdefault(mb.index, []).append("nonfinite-loss")
    return dict(sorted(why.items()))


MAX_MICROBATCHES = 4


def keep(why: dict[int, list[str]], limit: int = MAX_MICROBATCHES) -> tuple[dict[int, list[str]], int]:
    """(at most `limit` of `why`'s micro-batches: those the sentinel names first, then in index order; how many
    were left out)."""
    named = [i for i, r in why.items() if any(x.startswith("sentinel-") for x in r)]
    order = named + [i for i in why if i not in named]
    kept = set(order[:limit])
    return {i: r for i, r in why.items() if i in kept}, len(why) - len(kept)


def document(
    *, target: Target, coords: Coords, args, where: dict, report: dict, seen: list[Seen], why: dict, rows=None
) -> dict:
    """The bundle's dict (see nanscope.trace.bundles.bundle), tensors on the CPU.

    Args:
        rows: `rows(microbatch) -> (dump rows or None, how)`, the rollout-dump rows of a micro-batch's samples.
    """
    by_index = {mb.index: mb for mb in seen}
    microbatches, skipped = [], set()
    for index, reasons_ in why.items():
        mb = by_index.get(index)
        microbatch = mb.microbatch if mb is not None else index
        entry = {"index": index, "microbatch": microbatch, "why": reasons_}
        entry |= {"batch": None, "current": None, "loss": None, "parallel": _parallel(mb, coords)}
        found, how = rows(microbatch) if rows is not None else (None, "not derived")
        entry |= {"rows": found, "rows_how": how}
        if mb is not None:
            batch, not_kept = bundle.plain_batch(mb.batch)
            skipped.update(not_kept)
            sizes = [len(p) for p in guard.response_positions(target, mb.args, mb.batch, mb.parallel)]
            current = None
            if mb.logp is not None:
                current = {"log_probs": bundle.split(mb.logp, sizes), "entropy": bundle.split(mb.entropy, sizes)}
            loss = None if mb.loss is None else {"value": float(mb.loss), "finite": bool(torch.isfinite(mb.loss))}
            entry |= {"batch": batch, "current": current, "loss": loss}
        microbatches.append(entry)
    api = target.release
    return {
        "format": bundle.FORMAT,
        "nanscope": __version__,
        "release": {"name": api.name, "module": api.module, "log_prob_returns": api.log_prob_returns},
        **where,
        "coords": coords.to_dict(),
        "args": bundle.plain_args(args) if args is not None else {},
        "report": report,
        "microbatches": microbatches,
        "skipped_keys": sorted(skipped),
    }


def _parallel(mb: Seen | None, coords: Coords) -> dict:
    """The CP coordinate the loss call ran at: the harness's simulated one, else this rank's."""
    par = getattr(mb, "parallel", None)
    if par is not None:
        return {"cp_rank": int(par.cp_rank), "cp_size": int(par.cp_size)}
    return {"cp_rank": coords.cp_rank, "cp_size": coords.cp_size}


def _nonfinite_inputs(batch: dict) -> bool:
    parts = [torch.as_tensor(x).reshape(-1) for k in PER_TOKEN for x in batch.get(k) or []]
    return bool(parts) and not bool(torch.isfinite(torch.cat([p.float() for p in parts])).all())
