"""A step's repro bundles replayed together, as `nanscope trace REPORT_DIR` replays them: the first producers
over every rank, which loss, the class, the guard, and one line per bundle."""

from __future__ import annotations

import time
from pathlib import Path

from nanscope.trace.bundles import bundle_load, bundle_replay, bundle_text


def replay_step(bundles: list[Path]) -> dict:
    """The bundles (one per rank, at least one) replayed offline, with the keys a NANSCOPE_TRACE_STEP trace has
    (forward, backward, first_forward, first_backward, inputs)."""
    assert bundles, "a step with no bundle to replay"
    started, results = time.time(), []
    for path in bundles:
        doc = bundle_load.load(path)
        with bundle_replay.loss_path(doc) as loss:
            results.append(bundle_replay.replay(doc, loss, source=path.name).to_dict())
    first = bundle_replay.first_of(bundle_replay.records_of(results))
    found = [r for r in results if r["found"]]
    guards = [e["guard"] for r in results for e in r["microbatches"]]
    lines = [
        {"file": r["source"], "rank": r["coords"]["rank"], "found": r["found"], "class": r["class"]} for r in results
    ]
    return {
        "ranks_traced": len(results),
        "wall_s": time.time() - started,
        **{key: first.get(key) for key in ("forward", "backward", "first_forward", "first_backward")},
        "inputs": first.get("inputs", []),
        "loss": results[0]["loss"],
        "found": bool(found),
        "class": next((r["class"] for r in found if r["class"]), None),
        "guard_finite": all(g["loss_finite"] and not g["grad_nonfinite"] for g in guards),
        "verdict": bundle_text.verdict((found or results)[0]),
        "bundles": [{**line, "line": bundle_text.summary_line(r)} for line, r in zip(lines, results)],
    }
