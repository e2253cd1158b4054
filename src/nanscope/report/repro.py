"""Rendering of nanscope.repro's results: terminal (rich) and JSON."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from nanscope import case
from nanscope.megatron.spec import PEER_FAILED, failed_check
from nanscope.report import plugin_text
from nanscope.report import table as tables
from nanscope.report.text import span
from nanscope.repro import Matrix, PluginCheck, Repro, StepsCheck
from nanscope.trace.tracer import text as trace_text
from nanscope.trace.tracer.events import TraceReport


def _layers(record) -> str:
    return span(record.layers, empty="-") + (" + output" if record.holds_output_layer else "")


def _rank_outcome(record) -> str:
    if record.ok:
        return "ok"
    if failed_check(record):
        return "NaN check" if "found NaN" in record.error else "Inf check"
    if record.error_type == PEER_FAILED:
        return "stopped: a peer failed the check"
    return record.error_type or "error"


def outcome(rep: Repro) -> str:
    """A short cell: 'completed' or 'NaN check on 4/4 ranks, rank 3 raised first (last stage)': the first rank to
    raise Megatron's error, by wall clock (the sentinel's line names where the value was produced)."""
    if rep.observed != "nan-check":
        return rep.observed
    first = next(record for record in rep.ranks if record.rank == rep.first_failure)
    failed = sum(failed_check(record) for record in rep.ranks)
    stage = "last stage" if first.holds_output_layer else "pp " + str(first.pp)
    return f"NaN check on {failed}/{len(rep.ranks)} ranks, rank {first.rank} raised first ({stage})"


def verdict(rep: Repro) -> str:
    """One line: what happened and whether it is what was expected."""
    head = "as expected" if rep.ok else f"UNEXPECTED (expected {rep.expected})"
    if rep.observed == "completed":
        norms = sorted(  # NaNs first (a set keeps each NaN, and sorting NaNs among numbers has no order)
            {round(norm, 4) for record in rep.ranks for norm in record.optimizer_grad_norm if norm is not None},
            key=lambda norm: (norm == norm, norm),
        )
        return f"{head}: {rep.hazard} under the {rep.loss} loss: the step completed on all {len(rep.ranks)} ranks (grad norm {norms})"
    if rep.observed == "nan-check":
        frames = (
            "frames match the case's traceback" if rep.frames_match_case else "frames DIFFER from the case's traceback"
        )
        return f"{head}: {rep.hazard} under the {rep.loss} loss fails megatron-core's DDP NaN check: {outcome(rep)}; {frames}"
    return f"{head}: {rep.hazard} under the {rep.loss} loss: {rep.observed}"


def render(rep: Repro, console) -> None:
    """The per-rank table, the first failing rank's frames, notes and the verdict."""
    fault = f" --fault {rep.fault}" if rep.fault else ""
    once = " --fault-once" if rep.fault_once else ""
    table = Table(title=f"nanscope repro --hazard {rep.hazard} --loss {rep.loss}{fault}{once}")
    for column in ("rank", "pp", "tp", "layers held", "outcome", "error"):
        table.add_column(column, overflow="fold")
    for record in rep.ranks:
        cells = (
            str(record.rank),
            str(record.pp),
            str(record.tp),
            _layers(record),
            _rank_outcome(record),
            _megatron_line(record.error) if rep.fault_once else record.error or "",
        )
        table.add_row(*cells)
    console.print(table)
    first = next((record for record in rep.ranks if record.rank == rep.first_failure), None)
    if first is not None and first.frames:
        console.print(
            f"megatron-core frames of rank {first.rank} (case: {'same' if rep.frames_match_case else 'different'}):"
        )
        for name, line, func in first.frames:
            console.print(f"  {name}:{line} in {func}", highlight=False)
    if rep.site is not None:
        where = f"sample {rep.site[0]}" + (f", response token {rep.site[1]}" if rep.site[1] is not None else "")
        log_probs = ", ".join(f"{name} {value:.2f}" for name, value in (rep.site_log_probs or {}).items())
        console.print(
            f"hazard site (built against the model's log-prob pass): {where}"
            + (f": log-probs {log_probs}" if log_probs else ""),
            highlight=False,
        )
    if rep.trace is not None:
        console.print(f"trace (rank {rep.trace_rank}):")
        for line in _trace_lines(rep.trace):
            console.print("  " + line, highlight=False)
    if rep.sentinel is not None:
        console.print(f"sentinel: {sentinel_text(rep.sentinel)}", highlight=False)
        for line in rep.sentinel["evidence"] + expert_lines(rep.sentinel.get("expert_tokens")):
            console.print(f"  {line}", highlight=False)
    if rep.fault_once:
        console.print(rerun_line(rep.rerun), highlight=False, markup=False)
    for note in rep.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(verdict(rep), highlight=False)


def _megatron_line(error: str | None) -> str:
    """Megatron's error line of a rank's error: the hook's own lines before it (its verdict, its report in the
    launch's temp directory) are printed once, below the table."""
    lines = (error or "").splitlines()
    return next((line for line in lines if line.startswith("Rank ")), lines[-1] if lines else "")


def rerun_line(rerun: dict | None) -> str:
    """The plugin hook's rerun verdict (a report's "rerun"), as the hook prints it on a rank."""
    if rerun is None:
        return "nanscope: rerun: no verdict (no rank wrote a report)"
    from nanscope.slime_plugin.verdict import Verdict  # heavy: torch (the slime_plugin package imports its hook)

    fields = {**rerun, "not_ruled_out": tuple(rerun.get("not_ruled_out") or ())}
    return Verdict(**{name: fields.get(name) for name in Verdict.__dataclass_fields__}).line()


def expert_lines(tokens: dict | None) -> list[str]:
    """The failing micro-batch's per-expert token counts, one line per MoE layer that has an expert with 0 tokens, and
    the zero-token finding (trace.sentinels.expert_counts); nothing on a healthy step."""
    if not tokens or "layers" not in tokens:
        return []
    lines = [
        f"{layer['layer']}, micro-batch {tokens['microbatch']}: tokens per expert {layer['received']} "
        f"(experts {layer['zero']} received 0)"
        for layer in tokens["layers"]
        if layer["zero"]
    ]
    return lines + ([tokens["finding"]] if tokens.get("finding") else [])


def sentinel_text(finding: dict) -> str:
    """One line: the rank that produced the first non-finite value (first in causal order, `repro.sentinel_finding`;
    not necessarily the first to raise Megatron's error), where, and its class."""
    if finding["rank"] is None:
        return "nothing non-finite (every module output, gradient and loss input was finite)"
    where = (
        f"module {finding['module']}, {finding['direction']}, micro-batch {finding['microbatch']}"
        if finding["module"]
        else "no module"
    )
    cls = finding["class"] or "undecided: " + " or ".join(finding["candidates"])
    return f"rank {finding['rank']} produced it first (step {finding['step']}): {where}; class {cls}"


def _trace_lines(trace: dict) -> list[str]:
    """The forward and backward producers of a TraceReport dict, one line each (report.trace's words)."""
    return trace_text.summary_lines(TraceReport.from_dict(trace))


def to_json(rep: Repro) -> dict:
    """`{"ranks": [{"rank", "pp", "tp", "ok", "error", "grad_norms", ...}], "expected", "observed", ...}`."""
    ranks = [
        {
            "rank": record.rank,
            "pp": record.pp,
            "tp": record.tp,
            "dp": record.dp,
            "layers": record.layers,
            "holds_output_layer": record.holds_output_layer,
            "ok": record.ok,
            "error": record.error,
            "error_time": record.error_time,
            "error_step": record.error_step,
            "grad_norms": record.grad_norms,
            "optimizer_grad_norm": record.optimizer_grad_norm,
            "params_finite": record.params_finite,
            "losses": record.losses,
            "frames": [list(frame) for frame in record.frames],
        }  # fmt: skip
        for record in rep.ranks
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
        "case_frames": [list(frame) for frame in case.frames()],
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


def matrix_verdict(matrix: Matrix) -> str:
    failing_as_is = [row.hazard for row in matrix.rows if row.as_is.observed == "nan-check"]
    passing_as_is = [row.hazard for row in matrix.rows if row.as_is.observed == "completed"]
    unfixed = [row.hazard for row in matrix.rows if row.safe.expected != "completed"]
    if matrix.ok:
        elsewhere = (
            f"; it cannot fix {', '.join(unfixed)}, whose fix lives in a flag or the model "
            "(`nanscope hazards`), and fails the check there too"
            if unfixed
            else ""
        )
        return (
            f"as expected: slime v0.1.0's loss fails megatron-core's NaN check on {', '.join(failing_as_is)} "
            f"and completes on {', '.join(passing_as_is)}; nanscope's safe loss completes every other step with "
            f"finite parameters{elsewhere} ({matrix.wall_s:.0f} s)"
        )
    bad = [
        f"{row.hazard}/{loss}"
        for row in matrix.rows
        for loss, rep in (("as-is", row.as_is), ("safe", row.safe))
        if not rep.ok
    ]
    bad += [f"{row.hazard}/safe params" for row in matrix.rows if row.safe.ok and not row.safe.params_finite]
    return f"UNEXPECTED: {', '.join(bad)} did not behave as expected"


def _class_cell(finding: dict | None) -> str:
    if finding is None or finding["rank"] is None:
        return "-"
    return (finding["class"] or "/".join(finding["candidates"])) + (
        f" ({finding['module']})" if finding["module"] else ""
    )


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def render_matrix(matrix: Matrix, console) -> None:
    title = (
        f"nanscope repro: case slime-795 scaled down, {len(matrix.rows)} hazards x {{as-is, safe}} through "
        "megatron-core"
    )
    columns = (
        "hazard",
        "as-is (slime v0.1.0)",
        "sentinel class (as-is)",
        "safe (nanscope)",
        "grad norm (safe)",
        "params finite (safe)",
        "max |grad safe - as-is|",
    )
    rows = [
        (
            row.hazard,
            ("" if row.as_is.ok else "[red]UNEXPECTED[/] ") + outcome(row.as_is),
            _class_cell(row.as_is.sentinel),
            ("" if row.safe.ok else "[red]UNEXPECTED[/] ") + outcome(row.safe),
            _fmt(row.safe.grad_norm),
            "yes" if row.safe.params_finite else "[red]NO[/]",
            _fmt(row.grad_diff) if row.hazard == "healthy" else "",
        )
        for row in matrix.rows
    ]
    tables.render(title, columns, rows, console)
    example = next((row.as_is for row in matrix.rows if row.as_is.observed == "nan-check"), None)
    if example is not None:
        first = next(record for record in example.ranks if record.rank == example.first_failure)
        console.print(f"as-is error ({example.hazard}, rank {first.rank}): {first.error}", highlight=False)
        console.print(
            "frames "
            + ("match" if all(row.as_is.frames_match_case is not False for row in matrix.rows) else "DIFFER from")
            + " the case's traceback: "
            + " -> ".join(f"{name}:{line}" for name, line, _ in first.frames),
            highlight=False,
        )
    for row in matrix.rows:
        console.print(f"[bold]{row.hazard}[/]: {escape(row.mechanism)}")
    for note in matrix.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(matrix_verdict(matrix), highlight=False)


def matrix_to_json(matrix: Matrix) -> dict:
    return {
        "ok": matrix.ok,
        "verdict": matrix_verdict(matrix),
        "wall_s": matrix.wall_s,
        "layout": matrix.layout,
        "notes": matrix.notes,
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
            for row in matrix.rows
        ],
    }


# ---- several steps --------------------------------------------------------------------------


def _params_text(rep) -> str:
    if not rep.ranks:
        return ", no rank reported its parameters"
    return ", parameters finite" if rep.params_finite else ", parameters NOT finite"


def steps_verdict(check: StepsCheck) -> str:
    head = "as expected" if check.ok else "UNEXPECTED"
    twin = ""
    if check.twin is not None and check.param_diff is None:
        twin = (
            f"; safe's parameters after step {check.steps} were not compared with those of as-is on the hazard's "
            "defused twin: a run saved none (nothing was compared)"
        )
    elif check.twin is not None:
        same = "equal (bitwise)" if check.param_diff == 0.0 else f"differ (max |diff| {_fmt(check.param_diff)})"
        twin = f"; safe's parameters after step {check.steps} {same} those of as-is on the hazard's defused twin"
    died = f"dies at step {check.as_is_died_at}" if check.as_is_died_at else f"{check.as_is.observed}"
    return (
        f"{head}: {check.hazard} at step {check.inject_step} of {check.steps}: as-is {died}; "
        f"safe completes {check.safe_steps}/{check.steps} steps"
        + _params_text(check.safe)
        + twin
        + (_plugin_verdict(check.plugin) if check.plugin else "")
    )


def _plugin_verdict(plugin: PluginCheck) -> str:
    said = plugin.replay["verdict"] if plugin.replay else "no bundle to replay"
    warned = ""
    if plugin.drifts:
        warned = f"; warned at step {plugin.warned[0]}" if plugin.warned else "; NO warning before the step"
    return (
        f"; plugin: {len(plugin.reports)} ranks reported step {plugin.inject_step}, their bundles offline: {said}"
        + warned
    )


def render_steps(check: StepsCheck, console) -> None:
    title = f"nanscope repro --steps {check.steps} --inject-step {check.inject_step} --hazard {check.hazard}"
    columns = ("run", "outcome", "steps completed", "grad norm per step", "params finite")
    runs = [("as-is", check.as_is), ("safe", check.safe)] + (
        [("as-is, defused twin", check.twin)] if check.twin else []
    )
    if check.plugin:
        skip = "as-is + hook, skip" + (f", max skips {check.plugin.max_skips}" if check.plugin.max_skips else "")
        runs = (
            [("as-is + hook", check.as_is), ("safe (the plugin's loss) + hook", check.safe)]
            + runs[2:]
            + [(skip, check.plugin.skipped)]
        )
    rows = [
        (
            name,
            outcome(rep),
            str(min((len(record.optimizer_grad_norm) for record in rep.ranks), default=0)),
            _norms(rep),
            "yes" if rep.params_finite else "no",
        )
        for name, rep in runs
    ]
    tables.render(title, columns, rows, console)
    for line in plugin_lines(check.plugin) if check.plugin else []:
        console.print(line, highlight=False, markup=False)  # errors and paths hold brackets
    for note in check.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(steps_verdict(check), highlight=False)


def plugin_lines(plugin: PluginCheck) -> list[str]:
    """The raise run's report, the instruction it printed, what the replay found, and skip mode."""
    if not plugin.reports:
        return [f"plugin: no rank wrote a report at step {plugin.inject_step} ({outcome(plugin.raised)})"]
    first = plugin.reports[0]
    out = [
        f"plugin: ranks {span(sorted(report['rank'] for report in plugin.reports))} reported rollout "
        f"{first['rollout_id']} step {first['step_id']} (harness step {plugin.inject_step}); {plugin_text.first_value(plugin)}",
        f"the report says: {first['replay']['text']}",
    ]
    if plugin.scratch_dir and plugin.scratch_dir in first["replay"]["text"]:
        out.append(
            f"  ({plugin.scratch_dir} was the harness's temporary directory, removed when the run ended; in a slime run "
            "the path is where the run saved its rollouts (--save-debug-rollout-data); the replay below needs only the "
            "bundles)"
        )
    if plugin.replay is None:
        out.append("replay: no rank wrote a repro bundle")
    else:
        replay = plugin.replay
        left = f"`nanscope trace {plugin.report_dir}`" if plugin.report_dir else "nanscope trace"
        out.append(
            f"replay offline, as {left} does ({replay['ranks_traced']} bundles, {replay['wall_s']:.1f} s, no second "
            f"harness run), through {replay['loss']}:"
        )
        out += ["  " + bundle["line"] for bundle in replay["bundles"]]
        out += ["  " + line for line in trace_text.first_lines(plugin.replay)]
        out.append(f"  verdict: {replay['verdict']}")
        if replay["found"]:
            guard = "finite" if replay["guard_finite"] else "STILL NON-FINITE"
            out.append(f"  with the guard (the plugin's loss): loss and gradient {guard} in every replayed micro-batch")
    if plugin.warned or plugin.drifts:
        out.append(plugin_text.warning_line(plugin))
    log = plugin_text.hook_log(plugin.skipped)
    logged = ", ".join(str(entry["nanscope/skipped_steps"]) for entry in log)
    out.append(
        f"skip mode: {outcome(plugin.skipped)}; grad norm per step {_norms(plugin.skipped)}; "
        f"nanscope/skipped_steps logged per step: {logged or '-'}"
    )
    errors = {record.error for record in plugin.skipped.ranks if record.error}
    out += [f"skip mode stopped: {error}" for error in errors]
    out += [f"warning: not left in --report-dir: {why}" for why in plugin.left_out]
    return out


def _norms(rep: Repro) -> str:
    """The optimizer's grad norm per step, as the first rank recorded it."""
    return ", ".join(_fmt(norm) for norm in (rep.ranks[0].optimizer_grad_norm if rep.ranks else []))


def plugin_to_json(plugin: PluginCheck) -> dict:
    return {
        "ok": plugin.ok,
        "reports": plugin.reports,
        "replay": plugin.replay,
        "report_dir": plugin.report_dir,
        "report_dir_left_out": plugin.left_out,  # files that could not be left there, one line each
        "scratch_dir": plugin.scratch_dir,  # the harness's temporary directory (removed): the reports' rollouts path
        "warned_steps": plugin.warned,  # harness steps at which the raise run's hook printed a warning
        "warnings": [line for entry in plugin_text.hook_log(plugin.raised) for line in entry.get("warnings", [])],
        "skip": {
            **to_json(plugin.skipped),
            "expected": plugin.skip_expected,
            "max_skips": plugin.max_skips,
            "skipped_steps": [record.skipped_steps for record in plugin.skipped.ranks],
            "log": plugin_text.hook_log(plugin.skipped),
        },
    }


def steps_to_json(check: StepsCheck) -> dict:
    return {
        "ok": check.ok,
        "verdict": steps_verdict(check),
        "hazard": check.hazard,
        "steps": check.steps,
        "inject_step": check.inject_step,
        "as_is_died_at": check.as_is_died_at,
        "safe_steps_completed": check.safe_steps,
        "max_param_diff_safe_vs_defused_twin": check.param_diff,
        "as_is": to_json(check.as_is),
        "safe": to_json(check.safe),
        "defused_twin": to_json(check.twin) if check.twin else None,
        **({"plugin": plugin_to_json(check.plugin)} if check.plugin else {}),
        "wall_s": check.wall_s,
        "notes": check.notes,
    }
