"""A directory scan's HTML: the run's trend (per-rollout headroom, inline SVG), the rollouts' table, the files.

The trend's data is `nanscope.dumps.trend.trend`. The first chart draws the log-ratio maxima that reach an exp
with fp32's overflow line (88.72) and the guard's clamp (20), the second the train-rollout gap; both mark the
rollout where a hazard first appears and the rollouts that have no train dump. Self-contained: no script, no
network.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from nanscope.dumps.trend import METRICS, SERIES
from nanscope.report import files
from nanscope.report.html import esc, page
from nanscope.report.scan import directory_summary, files_samples_tokens, fmt_value

RED = "#b00020"


@dataclass(frozen=True)
class Line:
    """One series of a chart: its metric, legend text, colour, and dashed when it is a bound."""

    metric: str
    label: str
    color: str
    dashed: bool = False


LOG_RATIOS = (
    Line("max_kl_log_ratio", "KL ref - logp (train dump, exact)", "#1f5fa8"),
    Line("max_tis_log_ratio", "TIS old - rollout (train dump, exact)", "#2a9d8f"),
    Line("max_ppo_log_ratio", "PPO bound -old (train dump)", "#7b5ea7", dashed=True),
    Line("rollout_log_ratio_bound", "bound -rollout_log_probs (rollout dump)", "#555555", dashed=True),
)
GAPS = (
    Line("train_rollout_gap_max", "gap max", "#e08a00"),
    Line("train_rollout_gap_p99", "gap p99 (largest per dump)", "#b5452f", dashed=True),
    Line("train_rollout_gap_mean", "gap mean", "#6a994e"),
)
W, H = 960, 340
LEFT, RIGHT, TOP, BOTTOM = 56, 24, 34, 88  # the plot's margins: ticks, axis label and two legend rows below
CHAR = 7  # px per character of an 11px label, a little over DejaVu Sans's average (no script measures it)


def _y_range(values: list[float], least_top: float, most_top: float) -> tuple[float, float]:
    """(bottom, top) of the y axis: 0 (or below, to -40) up to the values' max, at least `least_top`."""
    finite = [v for v in values if math.isfinite(v)]
    lo = max(-40.0, math.floor(min(finite + [0.0]) / 10) * 10)
    hi = max(finite + [0.0])
    hi = least_top if hi * 1.1 <= least_top else min(most_top, hi * 1.1)
    return lo, hi


def chart_svg(
    rollouts: list[dict], lines: tuple[Line, ...], *, limits: list[tuple[float, str, str]], y_top: float
) -> str:
    """A line chart over the rollouts (x: rollout id), one polyline per series with a point per rollout.

    Args:
        limits: horizontal lines (value, label, colour); the first is drawn in red, solid, the others dashed.
        y_top: the y axis reaches at least this (it grows with the values, up to 2.5x).
    A NaN, inf or off-scale value is a triangle at the top; a rollout without a train dump is labelled.
    """
    ids = [e["rollout_id"] for e in rollouts]
    values = [e[line.metric] for e in rollouts for line in lines if e[line.metric] is not None]
    lo, hi = _y_range(values, y_top, 2.5 * y_top)
    x0, x1, y0, y1 = LEFT, W - RIGHT, H - BOTTOM, TOP
    span = max(ids[-1] - ids[0], 1) if ids else 1

    def x(rollout_id: int) -> float:
        return (x0 + x1) / 2 if len(ids) < 2 else x0 + 12 + (x1 - x0 - 24) * (rollout_id - ids[0]) / span

    def y(v: float) -> float:
        return y0 - (y0 - y1) * (min(max(v, lo), hi) - lo) / (hi - lo)

    out = [f"<svg width='{W}' height='{H}' xmlns='http://www.w3.org/2000/svg' font-size='11'>"]
    out += _axes(ids, lo, hi, x, y)
    for value, label, color in limits:
        if lo <= value <= hi:
            dash = "" if color == RED else " stroke-dasharray='5 4'"
            out.append(
                f"<line x1='{x0}' x2='{x1}' y1='{y(value):.1f}' y2='{y(value):.1f}' stroke='{color}' "
                f"stroke-width='{2 if color == RED else 1}'{dash}/>"
                f"<text x='{x0 + 4}' y='{y(value) - 4:.1f}' fill='{color}'>{esc(label)}</text>"
            )
    for line in lines:
        out += _series(rollouts, line, x, y, hi)
    out += _marks(rollouts, x, y0, y1)
    out += _legend(lines)
    out.append("</svg>")
    return "".join(out)


def _axes(ids: list[int], lo: float, hi: float, x, y) -> list[str]:
    """The frame, y ticks with grid lines, x ticks at the rollouts (at most ~24 labels) and the axis titles."""
    x0, x1, y0, y1 = LEFT, W - RIGHT, H - BOTTOM, TOP
    out = [f"<rect x='{x0}' y='{y1}' width='{x1 - x0}' height='{y0 - y1}' fill='none' stroke='#ccc'/>"]
    step = _nice_step((hi - lo) / 6)
    v = math.ceil(lo / step) * step
    while v <= hi + 1e-9:
        out.append(
            f"<line x1='{x0}' x2='{x1}' y1='{y(v):.1f}' y2='{y(v):.1f}' stroke='#eee'/>"
            f"<text x='{x0 - 5}' y='{y(v) + 4:.1f}' text-anchor='end'>{v:g}</text>"
        )
        v += step
    every = max(1, math.ceil(len(ids) / 24))
    for i, rollout_id in enumerate(ids):
        if i % every == 0 or i == len(ids) - 1:
            out.append(f"<text x='{x(rollout_id):.1f}' y='{y0 + 15}' text-anchor='middle'>{rollout_id}</text>")
    out.append(f"<text x='{(x0 + x1) / 2:.0f}' y='{y0 + 30}' text-anchor='middle' fill='#777'>rollout</text>")
    return out


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least `raw`."""
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _series(rollouts: list[dict], line: Line, x, y, hi: float) -> list[str]:
    """A series' polyline (broken where a rollout lacks the metric) and one point per rollout with a tooltip."""
    out, run = [], []
    dash = " stroke-dasharray='6 4'" if line.dashed else ""
    for e in rollouts + [None]:
        value = None if e is None else e[line.metric]
        if value is not None and math.isfinite(value):
            run.append(f"{x(e['rollout_id']):.1f},{y(value):.1f}")
            continue
        if len(run) > 1:
            out.append(f"<polyline points='{' '.join(run)}' fill='none' stroke='{line.color}' stroke-width='2'{dash}/>")
        run = []
    for e in rollouts:
        value = e[line.metric]
        if value is None:
            continue
        where = e["where"].get(line.metric, "")
        tip = f"rollout {e['rollout_id']}: {line.metric} {fmt_value(value)}" + (f" ({where})" if where else "")
        px = x(e["rollout_id"])
        if math.isfinite(value) and value <= hi:
            fill = "#fff" if line.dashed else line.color
            out.append(
                f"<circle cx='{px:.1f}' cy='{y(value):.1f}' r='4' fill='{fill}' stroke='{line.color}' "
                f"stroke-width='1.5'><title>{esc(tip)}</title></circle>"
            )
        else:  # NaN, inf or off the scale: a triangle at the top
            out.append(
                f"<path d='M{px - 5:.1f},{TOP + 10} L{px + 5:.1f},{TOP + 10} L{px:.1f},{TOP + 1} Z' "
                f"fill='{line.color}'><title>{esc(tip)}</title></path>"
            )
    return out


def _marks(rollouts: list[dict], x, y0: float, y1: float) -> list[str]:
    """The first hazard's vertical line and label; 'no train dump' under each rollout that has none."""
    out = []
    first = next((e for e in rollouts if e["would_nan"] != "no"), None)
    if first is not None:
        px = x(first["rollout_id"])
        anchor, dx = ("end", -6) if px > W / 2 else ("start", 6)
        label = f"first hazard: rollout {first['rollout_id']} ({first['would_nan']}): the run was heading here"
        out.append(
            f"<line class='first-hazard' x1='{px:.1f}' x2='{px:.1f}' y1='{y1 - 14}' y2='{y0}' stroke='{RED}' "
            f"stroke-width='1.5' stroke-dasharray='3 3'/><text x='{px + dx:.1f}' y='{y1 - 4}' "
            f"text-anchor='{anchor}' fill='{RED}' font-weight='600'>{esc(label)}</text>"
        )
    for e in rollouts:
        if e["rollout_dumps"] and not e["train_dumps"]:
            px = x(e["rollout_id"])
            anchor, dx = ("end", -6) if px > W / 2 else ("start", 6)
            out.append(
                f"<text class='no-train-dump' x='{px + dx:.1f}' y='{y0 - 6}' text-anchor='{anchor}' "
                "fill='#777'>no train dump</text>"
            )
    return out


def _legend(lines: tuple[Line, ...]) -> list[str]:
    """One swatch and label per series below the axis title, wrapped to a second row when they do not fit."""
    out, px, py = [], LEFT, H - 30
    for line in lines:
        width = 36 + CHAR * len(line.label)
        if px + width > W - RIGHT and px > LEFT:
            px, py = LEFT, py + 16
        dash = " stroke-dasharray='6 4'" if line.dashed else ""
        out.append(
            f"<line x1='{px}' x2='{px + 22}' y1='{py - 4}' y2='{py - 4}' stroke='{line.color}' "
            f"stroke-width='2'{dash}/><text x='{px + 27}' y='{py}'>{esc(line.label)}</text>"
        )
        px += width + 14
    return out


def headline(trend: dict) -> str:
    """The trend's first-hazard line: the HTML's headline, and `scan DIR`'s in the terminal."""
    first = trend["first_hazard"]
    if first is None:
        return "no rollout would produce NaN"
    return (
        f"first hazard at rollout {first['rollout_id']} (would produce NaN: {first['would_nan']}, via "
        f"{', '.join(first['mechanisms']) or '-'}): the run was heading here"
    )


def terminal_lines(trend: dict, root: str) -> list[str]:
    """`scan DIR`'s trend in the terminal: the rollouts and the first hazard in one line, then one line naming
    the files whose stored rollout_id is not their name's, if any (paths under `root`)."""
    rollouts = [e["rollout_id"] for e in trend["rollouts"]]
    if not rollouts:
        lines = [f"trend: {trend['note']}"]
    else:
        span = "1 rollout (" if len(rollouts) == 1 else f"{len(rollouts)} rollouts ({rollouts[0]}-"
        lines = [f"trend over {span}{rollouts[-1]}): {headline(trend)}"]
    off = trend["id_disagrees"]
    if off:
        shown = "; ".join(
            f"{os.path.relpath(d['path'], root)} stores {d['rollout_id']}, its name says {d['name_rollout']}"
            for d in off[:5]
        ) + (f"; and {len(off) - 5} more" if len(off) > 5 else "")
        lines.append(
            f"rollout ids: {len(off)} file(s) store a rollout_id their name does not give ({shown}): each is placed "
            "at the id it stores"
        )
    return lines


def trend_html(trend: dict) -> str:
    """The trend's section: both charts, the note on missing train dumps, the rollouts' table."""
    rollouts = trend["rollouts"]
    if not rollouts:
        return f"<h2>the run's trend</h2><p class='muted'>{esc(trend['note'])}</p>"
    first = trend["first_hazard"]
    limit, clamp = trend["limit"], trend["clamp"]
    body = [
        "<h2>the run's trend: per-rollout headroom</h2>",
        f"<p class='{'bad' if first else 'ok'}'>{esc(headline(trend))}</p>",
        f"<p class='muted'>largest log-ratio that reaches an exp, per rollout; red line: fp32 exp overflow "
        f"{limit:.2f}; dashed grey: the guard's clamp ±{clamp:g}; open points and dashed lines are bounds</p>",
        chart_svg(
            rollouts,
            LOG_RATIOS,
            limits=[(limit, f"fp32 exp overflow {limit:.2f}", RED), (clamp, f"guard clamp {clamp:g}", "#999999")],
            y_top=100.0,
        ),
    ]
    off = [
        f"rollout {e['rollout_id']} {m} {fmt_value(e[m])}"
        for e in rollouts
        for m in SERIES
        if isinstance(e[m], float) and not math.isfinite(e[m])
    ]
    if off:
        body.append(f"<p class='muted'>non-finite (triangles at the top): {esc('; '.join(off[:20]))}</p>")
    if trend["note"]:
        body.append(f"<p class='muted no-train-dump-note'>{esc(trend['note'])}</p>")
    body.append("<h2>train-rollout gap |log_probs - rollout_log_probs| (trained tokens)</h2>")
    body.append(chart_svg(rollouts, GAPS, limits=[], y_top=1.0))
    body.append(_table(rollouts))
    body.append("<ul class='muted'>" + "".join(f"<li><b>{k}</b>: {esc(v)}</li>" for k, v in METRICS.items()) + "</ul>")
    if trend["unplaced"]:
        body.append(f"<p class='muted'>not placed (no rollout id): {esc(', '.join(trend['unplaced'][:20]))}</p>")
    return "\n".join(body)


def _table(rollouts: list[dict]) -> str:
    heads = ("rollout", "dumps (train / rollout)", *SERIES, "would NaN", "mechanisms")
    head = "".join(f"<th>{esc(h).replace('_', '_<wbr>')}</th>" for h in heads)  # long names may break
    rows = [f"<table class='trend' style='font-size:12px'><tr>{head}</tr>"]
    for e in rollouts:
        cells = [str(e["rollout_id"]), f"{e['train_dumps']} / {e['rollout_dumps']}"]
        cells += ["-" if e[m] is None else fmt_value(e[m]) for m in SERIES]
        cells += [e["would_nan"], ", ".join(e["mechanisms"]) or "-"]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    return "".join(rows) + "</table>"


def render_directory_html(summaries: list, root: str, trend: dict) -> str:
    """A directory scan's page: its summary line, the run's trend, and one row per file."""
    totals = directory_summary(summaries)
    verdicts = totals["would_nan"]
    line = (
        f"{files_samples_tokens(totals)}: "
        f"would produce NaN: {verdicts['yes']} yes, {verdicts['possibly']} possibly, {verdicts['no']} no; "
        f"{totals['failed']} failed; {totals['total']:,} findings"
    )
    bad = verdicts["yes"] or verdicts["possibly"] or totals["failed"]
    body = [f"<p class='{'bad' if bad else 'ok'}'>{esc(line)}</p>", trend_html(trend), "<h2>dumps</h2>"]
    heads = ("file", "kind", "format", "samples", "tokens", "findings", "would NaN", "mechanisms / error")
    body.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>")
    for s in summaries:
        name = os.path.relpath(s.path, root)
        if s.error:
            cells = [name, *("-",) * 5, "error", s.error]
        else:
            note = ", ".join(s.mechanisms) or "-"
            if s.errors:
                note += f"; {len(s.errors)} length errors (slime would fail): {s.errors[0]}"
            cells = [
                name,
                s.kind,
                s.format,
                str(s.num_samples),
                f"{s.response_tokens:,}",
                str(s.total),
                s.would_nan,
                note,
            ]
        body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    body.append("</table>")
    return page(f"nanscope scan: {root}", "\n".join(body))


def write_directory_html(summaries: list, root: str, trend: dict, path: str) -> None:
    """`--html PATH` of a directory scan (an unwritable path is one UserError line)."""
    files.write_text(path, render_directory_html(summaries, root, trend), "--html")
