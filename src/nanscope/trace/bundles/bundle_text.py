"""A replayed repro bundle in words (`BundleReplay.to_dict()`), and one line per bundle for a run's directory.

Torch-free: `nanscope repro` renders the same dicts.
"""

from __future__ import annotations

from nanscope.trace.tracer import text
from nanscope.trace.tracer.events import Event, InputFinding, TraceReport

PHASES = (("forward", "first_forward"), ("backward", "first_backward"))


def rank_text(doc: dict) -> str:
    """`rank 2 (pp 1, tp 0, cp 0 of 1, dp 0 of 1)`."""
    c = doc["coords"]
    return (
        f"rank {c['rank']} (pp {c['pp']}, tp {c['tp']}, cp {c['cp_rank']} of {c['cp_size']}, "
        f"dp {c['dp_rank']} of {c['dp_size']})"
    )


def where_text(doc: dict) -> str:
    return f"rollout {doc['rollout_id']} step {doc['step_id']}, {rank_text(doc)}"


def lines(doc: dict) -> list[str]:
    """The whole replay: what was replayed through which loss, inputs, producers, class, the guard, the verdict."""
    out = [
        f"nanscope trace: {doc['source']}: {where_text(doc)}, written by nanscope {doc.get('nanscope')} "
        f"through {doc['release']['name']}",
        f"loss: {doc['loss']} ({doc['loss_why']})",
    ]
    out += [_entry_line(entry) for entry in doc["microbatches"]]
    out += [
        f"micro-batch {skip['microbatch']} (loss call {skip['index']}, {', '.join(skip['why']) or '-'}): no batch in "
        "the bundle: this rank holds no loss (not the last pipeline stage)"
        for skip in doc["not_replayed"]
    ]
    if not doc["microbatches"]:
        out.append(f"nothing to replay on this rank: {sentinel_text(doc.get('report'))}")
        return out
    if doc["approximate"]:
        out.append(
            "approximate: the bundle kept no current log-probs for some micro-batch; the old-policy log_probs stand "
            "in for them (a replay of the step's inputs, not of its logits)"
        )
    first = doc["first"]
    inputs = [InputFinding(**{k: f.get(k) for k in ("name", "nonfinite", "sample", "token", "masked")})
              for f in first.get("inputs", [])]  # fmt: skip
    out += text.lines(_report(first, inputs))
    out.append(f"class: {class_text(doc)}")
    out += guard_lines(doc)
    out.append("verdict: " + verdict(doc))
    return out


def _report(first: dict, inputs: list):
    event = lambda record: None if record is None else Event.from_dict(record)  # noqa: E731
    return TraceReport(
        forward=event(first.get("forward")),
        backward=event(first.get("backward")),
        ops_seen=0,
        first_forward=event(first.get("first_forward")),
        first_backward=event(first.get("first_backward")),
        inputs=inputs,
    )


def _entry_line(entry: dict) -> str:
    outcome, cp = entry["trace"]["outcome"], entry["cp"]
    loss = f"{outcome['loss']:.6g}" + ("" if outcome["loss_finite"] else " (non-finite)")
    cp_text = "" if cp["cp_size"] == 1 else f", cp {cp['cp_rank']} of {cp['cp_size']} ({cp['how']})"
    source = "the old-policy log_probs (approximate)" if entry["approximate"] else "its recorded current log-probs"
    return (
        f"micro-batch {entry['microbatch']} (loss call {entry['index']}, {', '.join(entry['why']) or '-'}{cp_text}): "
        f"replayed from {source}: loss {loss}, d loss / d log-probs {outcome['grad_nonfinite']} of "
        f"{outcome['grad_entries']} non-finite; samples: {entry['rows_how']}"
    )


def class_text(doc: dict) -> str:
    cls = doc["class"]
    if cls == "loss-numerics":
        return "loss-numerics (an op of the loss made a finite input non-finite)"
    if cls == "data":
        return "data (a non-finite input reached the loss: " + _input_names(doc) + ")"
    report = doc.get("report") or {}
    return f"not in the loss; the report's class: {report.get('class') or 'undecided'}"


def _input_names(doc: dict) -> str:
    return ", ".join(sorted({f["name"] for f in doc["first"].get("inputs", [])}))


def guard_lines(doc: dict) -> list[str]:
    """The guard's replay of each micro-batch: loss and gradient finite or not."""
    bad = [e for e in doc["microbatches"] if not (e["guard"]["loss_finite"] and e["guard"]["grad_nonfinite"] == 0)]
    losses = ", ".join(f"{e['guard']['loss']:.6g}" for e in doc["microbatches"])
    if not bad:
        return [
            f"with the guard (nanscope.loss.guard around {doc['loss']}, as the plugin's loss runs it): loss {losses}, "
            "finite; d loss / d log-probs finite in every micro-batch"
        ]
    return [
        f"with the guard: micro-batch {e['microbatch']} still non-finite (loss {e['guard']['loss']:.6g}, "
        f"{e['guard']['grad_nonfinite']} non-finite gradient entries)"
        for e in bad
    ]


def report_problem(report) -> str | None:
    """Why a sentinel report (a bundle's `report`, a report directory's .json) cannot be read as one, or None:
    `first_forward` / `first_backward` each None or {module: a string or None, microbatch: an integer or None},
    `class` a string or None."""
    if report is None:
        return None
    if not isinstance(report, dict):
        return f"expected a dict or None, got {type(report).__name__}"
    for key in ("first_forward", "first_backward"):
        hit = report.get(key)
        if hit is None:
            continue
        fine = isinstance(hit, dict) and isinstance(hit.get("module"), (str, type(None)))
        if not fine or not (hit.get("microbatch") is None or type(hit.get("microbatch")) is int):
            return f"{key}: expected None or {{module: a name, microbatch: an index}}, got {type(hit).__name__}"
    if not isinstance(report.get("class"), (str, type(None))):
        return f"class: expected a string or None, got {type(report.get('class')).__name__}"
    return None


def sentinel_text(report: dict | None) -> str:
    """The report's first non-finite module, in forward and in backward order."""
    report = report or {}
    parts = []
    for key, direction in (("first_forward", "forward"), ("first_backward", "backward")):
        hit = report.get(key)
        if hit:
            parts.append(f"{direction}: module {hit.get('module')!r}, micro-batch {hit.get('microbatch')}")
    if not parts:
        return "the report names no first module" if report else "the bundle holds no sentinel reading"
    return "the sentinel's first non-finite module, " + "; ".join(parts)


def first_event(doc: dict) -> dict | None:
    first = doc.get("first") or {}
    return first.get("forward") or first.get("backward")


def event_short(event: dict) -> str:
    """`aten.exp.default at nanscope/loss/formulas.py:144 in approx_kl, sample 2, response token 14 (masked)`."""
    source = (event.get("source") or "-").split(" `")[0]
    node = f" in {event['node']}" if event.get("node") else ""
    return f"{event['op']}{node} at {source}, {Event.from_dict(event).token_text()}"


def verdict(doc: dict) -> str:
    event = first_event(doc)
    if event is not None:
        return "the NaN starts in the loss: " + event_short(event)
    current = [f for f in (doc.get("first") or {}).get("inputs", []) if f["name"].startswith("current")]
    if doc["class"] == "data" and current:
        return (
            "--rollout-temperature is 0: the release's log-prob helper divides the logits by it, so every log-prob "
            "is NaN; the flag is the cause (`nanscope doctor` reads it from the launch script)"
        )
    if doc["class"] == "data":
        finding = next(f for f in doc["first"]["inputs"] if f["name"] not in ("current log_probs", "current entropy"))
        masked = " (loss_mask 0)" if finding.get("masked") else ""
        return (
            f"a non-finite input reached the loss: {finding['name']} at sample {finding['sample']}, response token "
            f"{finding['token']}{masked}; `nanscope scan` on that rollout's dump names its source"
        )
    if current:
        return (
            f"the log-probs the release computed from this step's logits were non-finite already (sample "
            f"{current[0]['sample']}, response token {current[0]['token']}): the NaN started upstream of the loss, in "
            f"the model; {sentinel_text(doc.get('report'))}"
        )
    return (
        "the loss replays finite from the recorded inputs: the NaN started upstream of the loss, in the model; "
        f"{sentinel_text(doc.get('report'))}; to name its op, rerun the step on the cluster as the report's "
        "replay says (NANSCOPE_TRACE_STEP)"
    )


def summary_line(doc: dict, named: list[int] = ()) -> str:
    """One line of a run's directory: where, and what the replay found.

    Args:
        named: the ranks whose bundle of the same step replays non-finite (a finite rank's values came from them).
    """
    head = f"{where_text(doc)}: "
    others = [rank for rank in named if rank != doc["coords"]["rank"]]
    ranks = sorted(set(others))
    elsewhere = f"; the loss on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} names it" if ranks else ""
    if not doc["microbatches"]:
        return head + f"no loss on this rank; {sentinel_text(doc.get('report'))}{elsewhere}"
    event = first_event(doc)
    if event is not None:
        return head + event_short(event) + f" ({class_text(doc).split(' (')[0]})"
    if not doc["found"] and others:
        return head + "its loss replays finite (none of its tokens holds the hazard)" + elsewhere
    return head + verdict(doc)
