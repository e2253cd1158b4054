"""A report directory's replayed bundles in words, beyond one line per bundle: the loss they replayed through, the
guard's replay and the verdict, as `nanscope trace BUNDLE` prints them for one (`trace.bundles.bundle_text`).

Each takes the replays' dicts (`BundleReplay.to_dict()`), in the directory's order (earliest step, then rank).
"""

from __future__ import annotations

from nanscope.report.text import span
from nanscope.trace.bundles import bundle_text


def loss_lines(replays: list[dict], slime_src: str | None = None) -> list[str]:
    """One line per loss the bundles replayed through (the release's own, or nanscope's model of v0.1.0), and why;
    a `--slime-src` that no bundle's loss came from is said to be unused."""
    groups: dict[tuple[str, str, bool], list[dict]] = {}
    for doc in replays:
        groups.setdefault((doc["loss"], doc["loss_why"], doc["release_loss"]), []).append(doc)
    out = []
    for (loss, why, own), docs in groups.items():
        unused = f"; --slime-src {slime_src} not used" if slime_src is not None and not own else ""
        which = "every bundle" if len(groups) == 1 else _where(docs)
        out.append(f"loss: {loss} ({why}{unused}), for {which}")
    return out


def guard_lines(replays: list[dict]) -> list[str]:
    """The guard's replay of the bundles that hold a loss: finite in every micro-batch, in one line, else one line
    per bundle that stays non-finite."""
    held = [doc for doc in replays if doc["microbatches"]]
    if not held:
        return []
    bad = [doc for doc in held if not _guard_finite(doc)]
    if bad:
        return [f"{bundle_text.where_text(doc)}: {line}" for doc in bad for line in bundle_text.guard_lines(doc)]
    losses = sorted({doc["loss"] for doc in held})
    around = losses[0] if len(losses) == 1 else "each bundle's loss"
    return [
        f"with the guard (nanscope.loss.guard around {around}, as the plugin's loss runs it): loss and d loss / d "
        f"log-probs finite in every replayed micro-batch of the {len(held)} bundle(s) that hold a loss ({_where(held)})"
    ]


def verdict_line(replays: list[dict]) -> str:
    """The verdict of the earliest bundle that names the cause in the loss, else of the earliest that holds a loss."""
    named = [doc for doc in replays if doc["found"]] or [doc for doc in replays if doc["microbatches"]]
    if not named:
        return (
            "verdict: no bundle holds a loss (none from the last pipeline stage): nothing replayed; each line above "
            "names its rank's first non-finite module"
        )
    doc = named[0]
    return f"verdict ({bundle_text.where_text(doc).split(' (')[0]}): {bundle_text.verdict(doc)}"


def _guard_finite(doc: dict) -> bool:
    return all(e["guard"]["loss_finite"] and e["guard"]["grad_nonfinite"] == 0 for e in doc["microbatches"])


def _where(docs: list[dict]) -> str:
    """'rollout 1 step 0, ranks 2-3; rollout 2 step 0, rank 2': the bundles, by step."""
    steps: dict[tuple[int, int], list[int]] = {}
    for doc in docs:
        steps.setdefault((doc["rollout_id"], doc["step_id"]), []).append(doc["coords"]["rank"])
    return "; ".join(
        f"rollout {r} step {s}, rank{'s' * (len(set(ranks)) > 1)} {span(sorted(set(ranks)), min_run=2)}"
        for (r, s), ranks in steps.items()
    )
