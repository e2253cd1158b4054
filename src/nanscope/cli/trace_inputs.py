"""`nanscope trace`'s inputs beside the file it names: the size cap of what it reads, and a bundle's rollout dump
(--rollout, or the one the bundle's args name), shared by a bundle's replay and a report directory's."""

from __future__ import annotations

import os

from nanscope.errors import UserError
from nanscope.inputs import fill_template
from nanscope.report import files


def limit(args) -> int:
    return args.max_input_mb  # in bytes (numbers.MEBIBYTES)


def rollout(args, doc: dict, cache: dict | None = None):
    """(path, token tuples per row) of the step's rollout dump: --rollout, else the one the bundle's args name.

    cache: the last dump read, kept for the next bundle of the same rollout (one dump at a time: a run's dumps
    are case-sized)."""
    from nanscope.dumps.io import load_rollout  # heavy: numpy and torch

    named = [(f"args: {k}", doc["args"].get(k)) for k in ("save_debug_rollout_data", "load_debug_rollout_data")]
    candidates = (
        [("--rollout", args.rollout)] if args.rollout else [(k, v) for k, v in named if isinstance(v, str) and v]
    )
    for what, template in candidates:
        path = fill_template(template, what, rollout_id=doc["rollout_id"], rank=doc["coords"]["rank"])
        if not args.rollout and not os.path.isfile(path):
            continue
        if cache is not None and path in cache:
            return cache[path]
        files.check_outputs({"--json": args.json}, [("rollout dump", path)])
        try:
            samples = load_rollout(path)
        except ValueError as e:
            if args.rollout:
                raise UserError(f"--rollout: {e}") from None
            continue  # a dump the run named but this machine cannot read: rows stay unknown, said so
        found = (path, [tuple(sample["tokens"].tolist()) for sample in samples])
        if cache is not None:
            cache.clear()
            cache[path] = found
        return found
    return None
