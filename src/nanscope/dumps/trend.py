"""A run's trend: the per-rollout headroom of a directory of dumps, and the rollout where a hazard first appears.

Each file's headroom (`nanscope.dumps.headroom`, computed by the worker that scanned it) is placed at its
rollout: the id the dump stores (`rollout_id`), else the one its name gives (`{rollout_id}.pt` for rollout
dumps, `{rollout_id}_{rank}.pt` for train dumps); a file whose stored id and name disagree is listed (slime
names each dump by its id, so one of them was renamed or copied). A rollout's train dumps (one per rank) combine as the
plugin reduces over ranks: maxima as maxima, the gap's mean over all their trained tokens, its 99th
percentile as the largest per-dump 99th percentile, the clamped tokens as the largest per-dump count.

slime writes a rollout's train dump after the rollout's training (its optimizer step), so the rollout whose
training failed has a rollout dump and no train dump: its points are the rollout dump's bounds only.
"""

from __future__ import annotations

import math

from nanscope.dumps.headroom import ROLLOUT_MAXIMA, TRAIN_MAXIMA, later
from nanscope.dumps.many import FileSummary, name_rollout
from nanscope.facts import ranges
from nanscope.facts.numerics import FP32_EXP_MAX, LOG_RATIO_BOUND

# What each metric of the series is, from which dump kind: the JSON's `metrics`, the chart's legend.
METRICS = {
    "max_kl_log_ratio": "train dumps: max of ref_log_probs - log_probs over every token, masked too "
    "(low_var_kl / k3 exponentiate it); exact at the rollout's first step, where logp = log_probs",
    "max_ppo_log_ratio": "train dumps: max of -log_probs, the bound on logp - old (logp <= 0); "
    "0 at the rollout's first step",
    "max_tis_log_ratio": "train dumps: max of log_probs - rollout_log_probs over every token (exact)",
    "train_rollout_gap_mean": "train dumps: mean of |log_probs - rollout_log_probs| over trained tokens (loss_mask 1)",
    "train_rollout_gap_p99": "train dumps: 99th percentile of the gap; over several ranks' dumps, the largest "
    "per-dump 99th percentile",
    "train_rollout_gap_max": "train dumps: max of the gap over trained tokens",
    "clamped_tokens": f"train dumps: tokens whose KL or TIS log-ratio lies beyond ±{LOG_RATIO_BOUND:g} (the "
    "guard's clamp); over several ranks' dumps, the largest count",
    "rollout_log_ratio_bound": "rollout dumps: max of -rollout_log_probs over every token: bounds TIS's "
    "old - rollout (old <= 0), and KL's ref - logp and PPO's logp - old where the trainer's log-probs match "
    "the engine's (scan's kl-margin bound)",
}
SERIES = tuple(METRICS)


def _stored_rollout(summary: FileSummary) -> int | None:
    """The dump's own integer rollout_id (a whole float counts), else None."""
    stored = summary.rollout_id
    if isinstance(stored, float) and stored.is_integer():
        stored = int(stored)
    return stored if ranges.in_range(stored, 0, ranges.MAX_ID) else None  # 10**23 is no rollout a run reaches


def rollout_of(summary: FileSummary) -> int | None:
    """The file's rollout: its stored integer rollout_id, else its name's ({id}.pt, {id}_{rank}.pt), else None."""
    stored = _stored_rollout(summary)
    return stored if stored is not None else name_rollout(summary.path)


def disagreements(summaries: list[FileSummary]) -> list[dict]:
    """The files whose stored rollout_id and name give two rollouts: {"path", "rollout_id" (stored, where the
    trend places it), "name_rollout"}."""
    out = []
    for summary in summaries:
        stored, named = _stored_rollout(summary), name_rollout(summary.path)
        if not summary.error and stored is not None and named is not None and stored != named:
            out.append({"path": summary.path, "rollout_id": stored, "name_rollout": named})
    return out


def _combine(values: list[float | None]) -> float | None:
    """The maximum of the values present (a NaN among them wins), None if none is."""
    best = None
    for value in values:
        if value is not None and (best is None or later(best, value)):
            best = value
    return best


def _rollout_entry(rollout_id: int, files: list[FileSummary]) -> dict:
    """One rollout's point of the series: every metric (None where no dump gives it), its dumps and verdict."""
    train = [f.headroom for f in files if f.kind == "train"]
    rollout = [f.headroom for f in files if f.kind == "rollout"]
    values = {name: _combine([h.values.get(name) for h in train]) for name in TRAIN_MAXIMA}
    values |= {name: _combine([h.values.get(name) for h in rollout]) for name in ROLLOUT_MAXIMA}
    count = sum(h.gap_count for h in train)
    values["train_rollout_gap_mean"] = sum(h.gap_sum for h in train) / count if count else None
    values["train_rollout_gap_p99"] = _combine([h.gap_p99 for h in train])
    clamped = [h.clamped_tokens for h in train if h.clamped_tokens is not None]
    values["clamped_tokens"] = max(clamped) if clamped else None
    entry: dict = {"rollout_id": rollout_id} | {name: values[name] for name in SERIES}
    entry["where"] = {  # metric -> "file: sample" holding the maximum
        name: f"{f.path}: sample {f.headroom.samples[name]}"
        for f in files
        for name in f.headroom.samples
        if entry.get(name) is not None and _same(f.headroom.values[name], entry[name])
    }
    verdicts = [f.would_nan for f in files]
    entry["would_nan"] = next((v for v in ("yes", "possibly") if v in verdicts), "no")
    entry["mechanisms"] = list(dict.fromkeys(m for f in files for m in f.mechanisms))
    entry["train_dumps"], entry["rollout_dumps"] = len(train), len(rollout)
    entry["files"] = [f.path for f in files]
    return entry


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def trend(summaries: list[FileSummary]) -> dict:
    """The series over the directory's dumps, in rollout order: the JSON's `trend` and the chart's data.

    Returns:
        {"limit": 88.72..., "clamp": 20.0, "metrics": METRICS, "rollouts": [one entry per rollout],
        "first_hazard": the first rollout whose dumps would produce NaN (yes or possibly) or None,
        "without_train_dump": rollouts with a rollout dump and no train dump, "unplaced": files whose rollout
        is unknown, "id_disagrees": files whose stored rollout_id is not their name's (`disagreements`), "note":
        the chart's note on the missing train dumps}. Files that failed are left out.
    """
    by_rollout: dict[int, list[FileSummary]] = {}
    unplaced = []
    for summary in summaries:
        if summary.error or summary.headroom is None:
            continue
        rollout_id = rollout_of(summary)
        if rollout_id is None:
            unplaced.append(summary.path)
        else:
            by_rollout.setdefault(rollout_id, []).append(summary)
    rollouts = [_rollout_entry(r, by_rollout[r]) for r in sorted(by_rollout)]
    first = next((e for e in rollouts if e["would_nan"] != "no"), None)
    missing = [e["rollout_id"] for e in rollouts if e["rollout_dumps"] and not e["train_dumps"]]
    return {
        "limit": FP32_EXP_MAX,
        "clamp": LOG_RATIO_BOUND,
        "metrics": METRICS,
        "rollouts": rollouts,
        "first_hazard": None
        if first is None
        else {
            "rollout_id": first["rollout_id"],
            "would_nan": first["would_nan"],
            "mechanisms": first["mechanisms"],
            "train_dump": bool(first["train_dumps"]),
        },
        "without_train_dump": missing,
        "unplaced": unplaced,
        "id_disagrees": disagreements(summaries),
        "note": _note(rollouts, missing),
    }


def _note(rollouts: list[dict], missing: list[int]) -> str:
    """What the chart says about the train dumps it lacks."""
    if not rollouts:
        return "no dump could be placed at a rollout"
    if not any(e["train_dumps"] for e in rollouts):
        return (
            "no train dumps (--save-debug-train-data): every point is a rollout dump's bound; "
            "the exact log-ratios need train dumps"
        )
    if not missing:
        return ""
    names = ", ".join(str(r) for r in missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
    return (
        f"no train dump for rollout {names}: slime writes a rollout's train dump after its training, so the "
        "rollout whose training failed has none; its point is the rollout dump's bound"
    )
