"""Rendering of nanscope.repro's results: terminal (rich) and JSON."""

from __future__ import annotations

from rich.markup import escape

from nanscope.report.text import span
from nanscope.repro import Matrix, PluginCheck, Repro, StepsCheck


def _layers(r) -> str:
    return span(r.layers, empty="-") + (" + output" if r.holds_output_layer else "")


def _rank_outcome(r) -> str:
    from nanscope.megatron.spec import PEER_FAILED, failed_check

    if r.ok:
        return "ok"
    if failed_check(r):
        return "NaN check" if "found NaN" in r.error else "Inf check"
    return "stopped: a peer failed the check" if r.error_type == PEER_FAILED else (r.error_type or "error")


def outcome(rep: Repro) -> str:
    """A short cell: 'completed' or 'NaN check, rank 3 first (last stage)'."""
    if rep.observed != "nan-check":
        return rep.observed
    from nanscope.megatron.spec import failed_check

    first = next(r for r in rep.ranks if r.rank == rep.first_failure)
    n = sum(failed_check(r) for r in rep.ranks)
    stage = "last stage" if first.holds_output_layer else "pp " + str(first.pp)
    return f"NaN check on {n}/{len(rep.ranks)} ranks, rank {first.rank} first ({stage})"


def verdict(rep: Repro) -> str:
    """One line: what happened and whether it is what was expected."""
    head = "as expected" if rep.ok else f"UNEXPECTED (expected {rep.expected})"
    if rep.observed == "completed":
        norms = sorted({round(g, 4) for r in rep.ranks for g in r.optimizer_grad_norm if g is not None})
        return f"{head}: {rep.hazard} under the {rep.loss} loss: the step completed on all {len(rep.ranks)} ranks (grad norm {norms})"
    if rep.observed == "nan-check":
        frames = (
            "frames match the case's traceback" if rep.frames_match_case else "frames DIFFER from the case's traceback"
        )
        return f"{head}: {rep.hazard} under the {rep.loss} loss fails megatron-core's DDP NaN check: {outcome(rep)}; {frames}"
    return f"{head}: {rep.hazard} under the {rep.loss} loss: {rep.observed}"


def render(rep: Repro, console) -> None:
    """The per-rank table, the first failing rank's frames, notes and the verdict."""
    from rich.table import Table

    fault = f" --fault {rep.fault}" if rep.fault else ""
    table = Table(title=f"nanscope repro --hazard {rep.hazard} --loss {rep.loss}{fault}")
    for col in ("rank", "pp", "tp", "layers held", "outcome", "error"):
        table.add_column(col, overflow="fold")
    for r in rep.ranks:
        table.add_row(str(r.rank), str(r.pp), str(r.tp), _layers(r), _rank_outcome(r), r.error or "")
    console.print(table)
    first = next((r for r in rep.ranks if r.rank == rep.first_failure), None)
    if first is not None and first.frames:
        console.print(
            f"megatron-core frames of rank {first.rank} (case: {'same' if rep.frames_match_case else 'different'}):"
        )
        for name, line, func in first.frames:
            console.print(f"  {name}:{line} in {func}", highlight=False)
    if rep.site is not None:
        where = f"sample {rep.site[0]}" + (f", response token {rep.site[1]}" if rep.site[1] is not None else "")
        lps = ", ".join(f"{k} {v:.2f}" for k, v in (rep.site_log_probs or {}).items())
        console.print(
            f"hazard site (built against the model's log-prob pass): {where}" + (f": log-probs {lps}" if lps else ""),
            highlight=False,
        )
    if rep.trace is not None:
        console.print(f"trace (rank {rep.trace_rank}):")
        for line in _trace_lines(rep.trace):
            console.print("  " + line, highlight=False)
    if rep.sentinel is not None:
        console.print(f"sentinel: {sentinel_text(rep.sentinel)}", highlight=False)
        for line in rep.sentinel["evidence"]:
            console.print(f"  {line}", highlight=False)
    for note in rep.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(verdict(rep), highlight=False)


def sentinel_text(s: dict) -> str:
    """One line: where the sentinel saw the first non-finite value, and its class."""
    if s["rank"] is None:
        return "nothing non-finite (every module output, gradient and loss input was finite)"
    where = f"module {s['module']}, {s['direction']}, micro-batch {s['microbatch']}" if s["module"] else "no module"
    cls = s["class"] or "undecided: " + " or ".join(s["candidates"])
    return f"rank {s['rank']} saw it first (step {s['step']}): {where}; class {cls}"


def _trace_lines(trace: dict) -> list[str]:
    """The forward and backward producers of a TraceReport dict, one line each (report.trace's words)."""
    from nanscope.trace import text as trace_text
    from nanscope.trace.locator import TraceReport

    return trace_text.summary_lines(TraceReport.from_dict(trace))


def to_json(rep: Repro) -> dict:
    """`{"ranks": [{"rank", "pp", "tp", "ok", "error", "grad_norms", ...}], "expected", "observed", ...}`."""
    from nanscope import case

    ranks = [
        {
            "rank": r.rank,
            "pp": r.pp,
            "tp": r.tp,
            "dp": r.dp,
            "layers": r.layers,
            "holds_output_layer": r.holds_output_layer,
            "ok": r.ok,
            "error": r.error,
            "error_time": r.error_time,
            "error_step": r.error_step,
            "grad_norms": r.grad_norms,
            "optimizer_grad_norm": r.optimizer_grad_norm,
            "params_finite": r.params_finite,
            "losses": r.losses,
            "frames": [list(f) for f in r.frames],
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
        "case_frames": [list(f) for f in case.frames()],
        "ranks": ranks,
        "hazard_site": rep.site,
        "site_log_probs": rep.site_log_probs,
        "wall_s": rep.wall_s,
        "notes": rep.notes,
        "verdict": verdict(rep),
        **({"trace": rep.trace, "trace_rank": rep.trace_rank} if rep.trace is not None else {}),
        "fault": rep.fault,
        "sentinel": rep.sentinel,
    }


# ---- the matrix -----------------------------------------------------------------------------


def matrix_verdict(m: Matrix) -> str:
    failing_as_is = [r.hazard for r in m.rows if r.as_is.observed == "nan-check"]
    passing_as_is = [r.hazard for r in m.rows if r.as_is.observed == "completed"]
    unfixed = [r.hazard for r in m.rows if r.safe.expected != "completed"]
    if m.ok:
        elsewhere = (
            f"; it cannot fix {', '.join(unfixed)}, whose fix lives in a flag or the model "
            "(`nanscope hazards`), and fails the check there too"
            if unfixed
            else ""
        )
        return (
            f"as expected: slime v0.1.0's loss fails megatron-core's NaN check on {', '.join(failing_as_is)} "
            f"and completes on {', '.join(passing_as_is)}; nanscope's safe loss completes every other step with "
            f"finite parameters{elsewhere} ({m.wall_s:.0f} s)"
        )
    bad = [f"{r.hazard}/{loss}" for r in m.rows for loss, rep in (("as-is", r.as_is), ("safe", r.safe)) if not rep.ok]
    bad += [f"{r.hazard}/safe params" for r in m.rows if r.safe.ok and not r.safe.params_finite]
    return f"UNEXPECTED: {', '.join(bad)} did not behave as expected"


def _class_cell(s: dict | None) -> str:
    if s is None or s["rank"] is None:
        return "-"
    return (s["class"] or "/".join(s["candidates"])) + (f" ({s['module']})" if s["module"] else "")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def render_matrix(m: Matrix, console) -> None:
    from rich.table import Table

    table = Table(
        title="nanscope repro: case slime-795 scaled down, every hazard x {as-is, safe} through megatron-core"
    )
    for col in (
        "hazard",
        "as-is (slime v0.1.0)",
        "sentinel class (as-is)",
        "safe (nanscope)",
        "grad norm (safe)",
        "params finite (safe)",
        "max |grad safe - as-is|",
    ):
        table.add_column(col, overflow="fold")
    for row in m.rows:
        table.add_row(
            row.hazard,
            ("" if row.as_is.ok else "[red]UNEXPECTED[/] ") + outcome(row.as_is),
            _class_cell(row.as_is.sentinel),
            ("" if row.safe.ok else "[red]UNEXPECTED[/] ") + outcome(row.safe),
            _fmt(row.safe.grad_norm),
            "yes" if row.safe.params_finite else "[red]NO[/]",
            _fmt(row.grad_diff) if row.hazard == "healthy" else "",
        )
    console.print(table)
    example = next((r.as_is for r in m.rows if r.as_is.observed == "nan-check"), None)
    if example is not None:
        first = next(r for r in example.ranks if r.rank == example.first_failure)
        console.print(f"as-is error ({example.hazard}, rank {first.rank}): {first.error}", highlight=False)
        console.print(
            "frames "
            + ("match" if all(r.as_is.frames_match_case is not False for r in m.rows) else "DIFFER from")
            + " the case's traceback: "
            + " -> ".join(f"{n}:{ln}" for n, ln, _ in first.frames),
            highlight=False,
        )
    for row in m.rows:
        console.print(f"[bold]{row.hazard}[/]: {escape(row.mechanism)}")
    for note in m.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(matrix_verdict(m), highlight=False)


def matrix_to_json(m: Matrix) -> dict:
    return {
        "ok": m.ok,
        "verdict": matrix_verdict(m),
        "wall_s": m.wall_s,
        "layout": m.layout,
        "notes": m.notes,
        "matrix": [
            {
                "hazard": row.hazard,
                "mechanism": row.mechanism,
                "as_is": to_json(row.as_is),
                "safe": to_json(row.safe),
                "safe_grad_norm": row.safe.grad_norm,
                "safe_params_finite": row.safe.params_finite,
                "max_grad_diff_safe_vs_as_is": row.grad_diff,
            }
            for row in m.rows
        ],
    }


# ---- several steps --------------------------------------------------------------------------


def steps_verdict(s: StepsCheck) -> str:
    head = "as expected" if s.ok else "UNEXPECTED"
    twin = ""
    if s.twin is not None:
        same = "equal (bitwise)" if s.param_diff == 0.0 else f"differ (max |diff| {_fmt(s.param_diff)})"
        twin = f"; safe's parameters after step {s.steps} {same} those of as-is on the hazard's defused twin"
    died = f"dies at step {s.as_is_died_at}" if s.as_is_died_at else f"{s.as_is.observed}"
    return (
        f"{head}: {s.hazard} at step {s.inject_step} of {s.steps}: as-is {died}; safe completes {s.safe_steps}/{s.steps} steps"
        + (", parameters finite" if s.safe.params_finite else ", parameters NOT finite")
        + twin
        + (_plugin_verdict(s.plugin) if s.plugin else "")
    )


def _plugin_verdict(p: PluginCheck) -> str:
    from nanscope.trace.locator import Event

    found = p.replay and (p.replay["forward"] or p.replay["first_forward"])
    where = f"{found['op']} at {found['source']}, {Event.from_dict(found).token_text()}" if found else "nothing"
    return f"; plugin: {len(p.reports)} ranks reported step {p.inject_step}, its replay names {where}"


def render_steps(s: StepsCheck, console) -> None:
    from rich.table import Table

    table = Table(title=f"nanscope repro --steps {s.steps} --inject-step {s.inject_step} --hazard {s.hazard}")
    for col in ("run", "outcome", "steps completed", "grad norm per step", "params finite"):
        table.add_column(col, overflow="fold")
    runs = [("as-is", s.as_is), ("safe", s.safe)] + ([("as-is, defused twin", s.twin)] if s.twin else [])
    if s.plugin:
        skip = "as-is + hook, skip" + (f", max skips {s.plugin.max_skips}" if s.plugin.max_skips else "")
        runs = (
            [("as-is + hook", s.as_is), ("safe (the plugin's loss) + hook", s.safe)]
            + runs[2:]
            + [(skip, s.plugin.skipped)]
        )
    for name, rep in runs:
        norms = rep.ranks[0].optimizer_grad_norm if rep.ranks else []
        table.add_row(
            name,
            outcome(rep),
            str(min((len(r.optimizer_grad_norm) for r in rep.ranks), default=0)),
            ", ".join(_fmt(n) for n in norms),
            "yes" if rep.params_finite else "no",
        )
    console.print(table)
    for line in plugin_lines(s.plugin) if s.plugin else []:
        console.print(line, highlight=False)
    for note in s.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(steps_verdict(s), highlight=False)


def plugin_lines(p: PluginCheck) -> list[str]:
    """The raise run's report, the instruction it printed, what the replay found, and skip mode."""
    from nanscope.trace import text as trace_text

    if not p.reports:
        return [f"plugin: no rank wrote a report at step {p.inject_step} ({outcome(p.raised)})"]
    r = next((x for x in p.reports if x["rank"] == p.raised.first_failure), p.reports[0])  # the first to fail
    hit = r["first_forward"] or r["first_backward"]
    where = f"module {hit['module']!r}, micro-batch {hit['microbatch']}" if hit else "accumulated gradients"
    out = [
        f"plugin: ranks {span(sorted(x['rank'] for x in p.reports))} reported rollout {r['rollout_id']} step "
        f"{r['step_id']} (harness step {p.inject_step}); rank {r['rank']}'s first non-finite: {where}",
        f"the report says: {r['replay']['text']}",
    ]
    if p.replay is None:
        out.append("replay: no rank wrote a trace")
    else:
        rp = p.replay
        out.append(
            f"replay with NANSCOPE_TRACE_STEP={rp['NANSCOPE_TRACE_STEP']} ({rp['ranks_traced']} ranks traced, "
            f"{rp['wall_s']:.0f} s):"
        )
        out += ["  " + line for line in trace_text.first_lines(p.replay)]
    log = next((x.hook_log for x in p.skipped.ranks if x.hook_log), [])
    logged = ", ".join(str(e["nanscope/skipped_steps"]) for e in log)
    out.append(
        f"skip mode: {outcome(p.skipped)}; grad norm per step {_norms(p.skipped)}; "
        f"nanscope/skipped_steps logged per step: {logged or '-'}"
    )
    errors = {x.error for x in p.skipped.ranks if x.error}
    out += [f"skip mode stopped: {e}" for e in errors]
    return out


def _norms(rep: Repro) -> str:
    return ", ".join(_fmt(n) for n in (rep.ranks[0].optimizer_grad_norm if rep.ranks else []))


def plugin_to_json(p: PluginCheck) -> dict:
    return {
        "ok": p.ok,
        "reports": p.reports,
        "replay": p.replay,
        "skip": {
            **to_json(p.skipped),
            "expected": p.skip_expected,
            "max_skips": p.max_skips,
            "skipped_steps": [r.skipped_steps for r in p.skipped.ranks],
            "log": next((r.hook_log for r in p.skipped.ranks if r.hook_log), []),
        },
    }


def steps_to_json(s: StepsCheck) -> dict:
    return {
        "ok": s.ok,
        "verdict": steps_verdict(s),
        "hazard": s.hazard,
        "steps": s.steps,
        "inject_step": s.inject_step,
        "as_is_died_at": s.as_is_died_at,
        "safe_steps_completed": s.safe_steps,
        "max_param_diff_safe_vs_defused_twin": s.param_diff,
        "as_is": to_json(s.as_is),
        "safe": to_json(s.safe),
        "defused_twin": to_json(s.twin) if s.twin else None,
        **({"plugin": plugin_to_json(s.plugin)} if s.plugin else {}),
        "wall_s": s.wall_s,
        "notes": s.notes,
    }
