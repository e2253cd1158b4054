"""Rendering of nanscope.natural's check: terminal (rich) and JSON (`natural.*`)."""

from __future__ import annotations

from rich.markup import escape

from nanscope import case
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.launch import words
from nanscope.natural import NaturalCheck, differences, hook_log
from nanscope.report import repro
from nanscope.report import table as tables
from nanscope.report.repro import outcome
from nanscope.report.text import span

SHOWN_AFTER = 2  # series rows rendered past the as-is death (the JSON has every step)


def verdict(check: NaturalCheck) -> str:
    """One line: the death, the crossing, the plugin's run and its warning."""
    head = "as expected" if check.ok else "UNEXPECTED"
    if check.died_at is None:
        died = f"as-is did not die in {check.steps} steps ({check.as_is.observed})"
    else:
        frames = "the case's message and frames" if check.as_is.frames_match_case else "frames DIFFER from the case's"
        died = f"as-is died at step {check.died_at} through megatron-core's bucket check ({frames})"
    found = check.crossing
    where = f"; the {found['exp']}'s exp crossed {FP32_EXP_MAX:.2f} first, {_place(found)}" if found else ""
    warned = (
        f"warned at step {check.warned[0]}, {words.count(check.died_at - check.warned[0], 'step')} ahead"
        if check.warned and check.died_at
        else ("warned at step " + str(check.warned[0]) if check.warned else "NO warning")
    )
    return (
        f"{head}: seed {check.seed}, lr {check.lr:g}: {died}{where}; with the plugin {check.finite_steps}/"
        f"{check.steps} steps finite, nan_guard/exp_overflow {sum(check.exp_overflow)} tokens, {warned}"
    )


def _place(found: dict) -> str:
    kind = f"a masked tool token (tool span {found['span'][0]}-{found['span'][1] - 1})" if found["masked"] else (
        "a trained token (loss_mask 1)")  # fmt: skip
    return (
        f"step {found['step']}, sample {found['sample']}, response token {found['token']}: {kind}, "
        f"log-ratio {found['log_ratio']:.2f}"
    )


def render(check: NaturalCheck, console) -> None:
    """What differs from the case, the series, the death and where it crossed, the plugin's run, the verdict."""
    title = "what the natural loop changes from the case's run"
    tables.render(title, ("", "the case", "here"), [tuple(map(escape, row)) for row in differences(check)], console)
    tables.render(*_series_table(check), console)
    for line in lines(check):
        console.print(line, highlight=False, markup=False)  # messages hold brackets
    for note in check.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(verdict(check), highlight=False)


def _series_table(check: NaturalCheck) -> tuple[str, tuple[str, ...], list[tuple[str, ...]]]:
    """(title, columns, rows) of each step's headroom."""
    title = (f"nanscope repro --natural --seed {check.seed} --steps {check.steps} --lr {check.lr:g}: "
             "each step's headroom (the plugin run's; as-is's is the same up to its death)")  # fmt: skip
    columns = ("step", "reward", "entropy", "max KL log-ratio", "at", "on tool tokens: mean",
               "PPO", "TIS", "exp overflow", "plugin warned")  # fmt: skip
    rows = []
    warned = set(check.warned)
    last = (check.died_at or check.steps) + SHOWN_AFTER
    for entry in check.series[:last]:
        at = entry["at"]["max_kl_log_ratio"]
        where = f"sample {at['sample']} token {at['token']}" + (" (tool)" if at["masked"] else "") if at else "-"
        cells = [
            str(entry["step"]) + (" (as-is dies)" if entry["step"] == check.died_at else ""),
            f"{entry['reward']:.2f}", f"{entry['entropy']:.2f}", f"{entry['max_kl_log_ratio']:.2f}", where,
            f"{entry['mean_kl_log_ratio_tool']:.2f}", f"{entry['max_ppo_log_ratio']:.2g}",
            f"{entry['max_tis_log_ratio']:.2g}", str(entry["exp_overflow"]), "yes" if entry["step"] in warned else "",
        ]  # fmt: skip
        rows.append(tuple(cells))
    if len(check.series) > last:
        rest = check.series[last:]
        cells = [f"{rest[0]['step']}-{rest[-1]['step']}", "", "", f"up to {max(e['max_kl_log_ratio'] for e in rest):.2f}",
                 "", "", "", "", str(sum(e["exp_overflow"] for e in rest)), ""]  # fmt: skip
        rows.append(tuple(cells))
    return title, columns, rows


def lines(check: NaturalCheck) -> list[str]:
    """The as-is death, the crossing, the plugin's run and its first warning, one line each."""
    out = [f"as-is: {outcome(check.as_is)}; at step {check.died_at}: {check.message}" if check.died_at else
           f"as-is: {check.as_is.observed} in {check.steps} steps"]  # fmt: skip
    found = check.crossing
    if found:
        out.append(
            f"crossing: the {found['exp']}'s exp first, {_place(found)} (ref log-prob {found['ref_log_prob']:.2f}, "
            f"the policy's {found['log_prob']:.2f}, old {found['old_log_prob']:.2f})"
        )
    overflow = check.exp_overflow
    steps = [i + 1 for i, n in enumerate(overflow) if n]
    out.append(
        f"plugin: {outcome(check.plugin)}, {check.finite_steps}/{check.steps} steps with a finite grad norm, "
        f"parameters {'finite' if check.plugin.params_finite else 'NOT finite'}; nan_guard/exp_overflow "
        f"{sum(overflow)} tokens" + (f" at steps {span(steps, min_run=2)}" if steps else "")
    )
    first = next((entry["warnings"][0] for entry in hook_log(check.plugin) if entry.get("warnings")), None)
    if first:
        out.append(f"early warning: the plugin warned at steps {span(check.warned, min_run=2)}; first: {first}")
    same = "the same" if check.same_until_death else "NOT the same"
    out.append(f"as-is and plugin runs: {same} training up to the death (series and grad norms)")
    return out


def to_json(check: NaturalCheck) -> dict:
    """`{"ok", "verdict", "natural": {"series", "as_is", "crossing", "plugin", "differences", ...}}`."""
    overflow = check.exp_overflow
    natural = {
        "seed": check.seed,
        "steps": check.steps,
        "lr": check.lr,
        "series": check.series,
        "as_is": {
            "died_at_step": check.died_at,
            "message": check.message,
            "case_message": case.nan_check_message(),
            "frames_match_case": check.as_is.frames_match_case,
            "same_until_death": check.same_until_death,
            "run": repro.to_json(check.as_is),
        },
        "crossing": check.crossing,
        "plugin": {
            "steps": check.steps,
            "finite_steps": check.finite_steps,
            "warned_steps": check.warned,
            "warnings": [line for entry in hook_log(check.plugin) for line in entry.get("warnings", [])],
            "exp_overflow": sum(overflow),
            "exp_overflow_per_step": overflow,
            "run": repro.to_json(check.plugin),
        },
        "differences": [{"what": what, "case": there, "here": here} for what, there, here in differences(check)],
        "wall_s": check.wall_s,
        "notes": check.notes,
    }
    return {"ok": check.ok, "verdict": verdict(check), "natural": natural}
