"""Rendering of a `nanscope scan` result: terminal table (rich), JSON, and HTML with inline SVG plots."""

from __future__ import annotations

import math
import os
from dataclasses import asdict

import numpy as np

from nanscope.dumps.checks import KINDS
from nanscope.dumps.result import HIST_HI, HIST_LO, ScanResult, hazard_count
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.inputs import printable
from nanscope.launch import words
from nanscope.report import files
from nanscope.report.html import esc, page


def fmt_value(v) -> str:
    """A hazard value for people: nan/inf spelled out, floats to 4 significant digits."""
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if not math.isfinite(v) else f"{v:.4g}"
    return str(v)


def _json_value(v):
    """JSON has no nan/inf: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


# -------------------------------------------------------------------------------------------- terminal


def render_terminal(result: ScanResult, console, max_rows: int = 30) -> None:
    """Print the hazard table, the per-check summary and the verdict to a rich Console."""
    from rich import box  # heavy: rich, only the terminal renderers need it
    from rich.table import Table

    head = (
        f"{result.path}: {result.dump_kind} dump, rollout {result.rollout_id}"
        + (f", rank {result.rank}" if result.rank is not None else "")
        + f", {result.num_samples} samples, {result.response_tokens:,} response tokens"
    )
    console.print(printable(head), highlight=False, markup=False)
    console.print(printable(format_line(result)), highlight=False, markup=False)
    if result.hazards:
        _hazards(result, console, max_rows)
    summary = Table(title="checks", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("check", "count", "mechanism", "note"):
        summary.add_column(
            column, justify="right" if column == "count" else "left", no_wrap=column != "note", min_width=len(column)
        )
    for check in result.checks:
        count = "skipped" if check.status == "skipped" else str(check.count)
        summary.add_row(*map(_cell, (check.kind, count, ", ".join(check.mechanisms) or "-", check.note)))
    console.print(summary)
    if any(not h.certain for h in result.hazards[:max_rows]):  # explained where a shown row has one
        console.print("?: bound only (the dump lacks one side of the log-ratio; see the note)", style="dim")
    style = {"yes": "bold red", "possibly": "bold yellow", "no": "bold green"}[result.would_nan]
    console.print(printable(result.verdict), style=style, highlight=False, markup=False)


def format_line(result: ScanResult) -> str:
    """The release format the dump was read as and how its fields differ from v0.1.0's, in one line."""
    f = result.format
    same = f" (also {', '.join(f.same_as[1:])})" if len(f.same_as) > 1 else ""
    diff = [
        f"{len(names)} field(s) {what} v0.1.0's: {', '.join(names)}"
        for names, what in ((f.fields_added, "beyond"), (f.fields_removed, "missing from"))
        if names
    ]
    parts = [*diff, f"rollout_log_probs checked as {f.rollout_logprob_dtype}"] + ([f.note] if f.note else [])
    return f"format: slime {f.release}{same}; " + "; ".join(parts)


TABLE_WIDTH = 130  # the hazard table's eight columns fit from here; narrower, each hazard is two lines


def _hazards(result: ScanResult, console, max_rows: int) -> None:
    """The first `max_rows` hazards: a table of eight columns on a wide console; on a narrow one, each hazard as a
    line of its fields and its note below it (no column is dropped)."""
    from rich import box  # heavy: rich, only the terminal renderers need it
    from rich.table import Table

    title = f"hazards (first {min(max_rows, len(result.hazards))} of {hazard_count(result)})"
    rows = [
        (
            str(hazard.sample),
            _opt(hazard.token),
            _opt(hazard.abs_token),
            _opt(hazard.masked),
            fmt_value(hazard.value),
            hazard.kind,
            (hazard.mechanism or "-") + ("" if hazard.certain else "?"),
            hazard.detail,
        )
        for hazard in result.hazards[:max_rows]
    ]
    columns = ("sample", "token", "abs_token", "masked", "value", "kind", "mechanism", "note")
    if console.width < TABLE_WIDTH:
        from rich.padding import Padding  # heavy: rich, only the terminal renderers need it

        console.print(title, highlight=False, markup=False)
        for row in rows:  # indented as a block: a wrapped line keeps its indent
            fields = ", ".join(f"{name} {value}" for name, value in zip(columns[:5], row[:5]) if value)
            console.print(Padding(_cell(f"{fields}: {row[5]}, mechanism {row[6]}"), (0, 0, 0, 2)))
            if row[7]:
                console.print(Padding(_cell(row[7]), (0, 0, 0, 6)))
        return
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in ("sample", "token", "abs_token", "value") else "left",
            no_wrap=column not in ("mechanism", "note"),
            min_width=min(len(column), 9),
            overflow="fold",
        )
    for row in rows:
        table.add_row(*map(_cell, row))
    console.print(table)


def _cell(text: str):
    """A table cell of text that may come from a file (a file name, a reward key in an error): never rich markup
    (`[/]` would raise, `[link=...]` would render), its control characters escaped."""
    from rich.text import Text  # heavy: rich, only the terminal renderers need it

    return Text(printable(text))


def _opt(x) -> str:
    return "" if x is None else str(x).lower() if isinstance(x, bool) else str(x)


# ------------------------------------------------------------------------------------------------ JSON


def to_json(result: ScanResult) -> dict:
    """The JSON document: `hazards` [{kind, mechanism, sample, token, abs_token, masked, value, certain,
    detail}], `summary` {counts, listed, checks, would_nan, mechanisms, verdict, errors}, `dump`, `config`."""
    hazards = []
    for h in result.hazards:
        d = asdict(h)
        d["value"] = _json_value(d["value"])
        hazards.append(d)
    summary = {
        "counts": {c.kind: c.count for c in result.checks if c.status == "ran"},
        "listed": {c.kind: c.listed for c in result.checks if c.status == "ran"},
        "checks": [asdict(c) for c in result.checks],
        "total": hazard_count(result),
        "would_nan": result.would_nan,
        "mechanisms": result.mechanisms,
        "verdict": result.verdict,
        "errors": result.errors,
    }
    dump = {
        "path": result.path,
        "kind": result.dump_kind,
        "rollout_id": result.rollout_id,
        "rank": result.rank,
        "num_samples": result.num_samples,
        "response_tokens": result.response_tokens,
    }
    return {
        "dump": dump,
        "format": result.format.to_dict(),
        "config": asdict(result.flags),  # the slime flags the dump was checked against
        "hazards": hazards,
        "summary": summary,
    }


def write_json(result: ScanResult, path: str) -> None:
    """`--json PATH`: the document of `to_json` (an unwritable path is one UserError line)."""
    files.write_json(path, to_json(result), "--json")


# ------------------------------------------------------------------------------------------------ HTML


def render_html(result: ScanResult) -> str:
    """A self-contained page: verdict, check table, log-ratio histograms, per-sample hazard map, hazards."""
    cls = {"yes": "bad", "possibly": "bad", "no": "ok"}[result.would_nan]
    body = [
        f"<p class='{cls}'>{esc(result.verdict)}</p>",
        f"<p class='muted'>{esc(result.path)}: {esc(result.dump_kind)} dump, "
        f"rollout {esc(str(result.rollout_id))}, "
        f"{result.num_samples} samples, {result.response_tokens:,} response tokens</p>",
        f"<p class='muted'>{esc(format_line(result))}</p>",
    ]
    if result.errors:
        body.append(
            "<h2>errors (slime v0.1.0 would fail on these)</h2><ul>"
            + "".join(f"<li>{esc(e)}</li>" for e in result.errors[:50])
            + "</ul>"
        )
    body.append("<h2>checks</h2><table><tr><th>check</th><th>count</th><th>mechanism</th><th>note</th></tr>")
    for c in result.checks:
        count = "skipped" if c.status == "skipped" else str(c.count)
        body.append(
            f"<tr><td>{esc(c.kind)}</td><td>{count}</td><td>{esc(', '.join(c.mechanisms) or '-')}</td>"
            f"<td>{esc(c.note)}</td></tr>"
        )
    body.append("</table>")
    for key, h in result.histograms.items():
        body.append(
            f"<h2>{esc(key)}: per-token log-ratio</h2><p class='muted'>{esc(h.label)}; "
            f"red line: fp32 exp limit {FP32_EXP_MAX:.2f}; grey: masked tokens; {h.nan} nan not shown</p>"
        )
        body.append(histogram_svg(h.all, h.masked, FP32_EXP_MAX))
    body.append("<h2>per-sample hazard map</h2>")
    body.append(hazard_map_svg(result.per_sample, list(KINDS), result.flags.n_samples_per_prompt))
    body.append(
        f"<h2>hazards (first {min(500, len(result.hazards))} listed)</h2><table><tr>"
        + "".join(
            f"<th>{c}</th>" for c in ("kind", "mechanism", "sample", "token", "abs_token", "masked", "value", "note")
        )
        + "</tr>"
    )
    for h in result.hazards[:500]:
        mech = (h.mechanism or "-") + ("" if h.certain else " (bound)")
        body.append(
            f"<tr><td>{esc(h.kind)}</td><td>{esc(mech)}</td><td>{h.sample}</td><td>{_opt(h.token)}</td>"
            f"<td>{_opt(h.abs_token)}</td><td>{_opt(h.masked)}</td><td>{esc(fmt_value(h.value))}</td>"
            f"<td>{esc(h.detail)}</td></tr>"
        )
    body.append("</table>")
    return page(f"nanscope scan: {result.path}", "\n".join(body))


def histogram_svg(counts: np.ndarray, masked: np.ndarray, limit: float, w: int = 900, h: int = 220) -> str:
    """Bars of log10(1+count) per unit bin on [HIST_LO, HIST_HI) (ends: under/overflow), a line at `limit`."""
    n = counts.size
    pad_l, pad_b = 40, 30
    bw = (w - pad_l - 10) / n
    top = max(1.0, math.log10(1 + float(counts.max())))

    def bar(c: float) -> float:
        return (h - pad_b - 10) * math.log10(1 + c) / top

    out = [f"<svg width='{w}' height='{h}' xmlns='http://www.w3.org/2000/svg' font-size='11'>"]
    for b in range(n):
        x = pad_l + b * bw
        for c, color in ((counts[b], "#4a78b5"), (masked[b], "#999")):
            if c:
                y = bar(float(c))
                out.append(
                    f"<rect x='{x:.1f}' y='{h - pad_b - y:.1f}' width='{max(bw - 0.5, 0.5):.1f}' "
                    f"height='{y:.1f}' fill='{color}'><title>{_bin_label(b, n)}: {int(c)}</title></rect>"
                )
    lx = pad_l + (limit - HIST_LO + 1) * bw
    out.append(f"<line x1='{lx:.1f}' x2='{lx:.1f}' y1='5' y2='{h - pad_b}' stroke='#b00020' stroke-width='2'/>")
    out.append(f"<text x='{lx + 3:.1f}' y='15' fill='#b00020'>{limit:.2f}</text>")
    for v in range(HIST_LO, HIST_HI + 1, 20):
        x = pad_l + (v - HIST_LO + 1) * bw
        out.append(f"<text x='{x:.1f}' y='{h - 12}' text-anchor='middle'>{v}</text>")
    out.append("<text x='2' y='15'>log10(1+n)</text></svg>")
    return "".join(out)


def _bin_label(b: int, n: int) -> str:
    if b == 0:
        return f"< {HIST_LO}"
    if b == n - 1:
        return f">= {HIST_HI}"
    return f"[{HIST_LO + b - 1}, {HIST_LO + b})"


def hazard_map_svg(per_sample: np.ndarray, kinds: list[str], group: int, cell: int = 10) -> str:
    """Rows: check kinds; columns: samples (a tick every GRPO group). Darker = more hazards (log scale)."""
    num, k = per_sample.shape
    cell = max(2, min(cell, 1400 // max(num, 1)))
    left = 190
    w, h = left + num * cell + 10, k * cell * 1.6 + 40
    top = math.log10(1 + max(1, int(per_sample.max()) if per_sample.size else 1))
    out = [f"<svg width='{w}' height='{h:.0f}' xmlns='http://www.w3.org/2000/svg' font-size='11'>"]
    rh = cell * 1.6
    for j, kind in enumerate(kinds):
        y = 10 + j * rh
        out.append(f"<text x='{left - 6}' y='{y + rh * 0.7:.1f}' text-anchor='end'>{esc(kind)}</text>")
        for i in np.flatnonzero(per_sample[:, j]).tolist():
            c = int(per_sample[i, j])
            a = 0.25 + 0.75 * math.log10(1 + c) / top
            out.append(
                f"<rect x='{left + i * cell}' y='{y:.1f}' width='{cell}' height='{rh - 1:.1f}' "
                f"fill='#b00020' fill-opacity='{a:.2f}'><title>sample {i}: {c} {esc(kind)}</title></rect>"
            )
    y0 = 10 + k * rh
    out.append(f"<rect x='{left}' y='10' width='{num * cell}' height='{k * rh:.1f}' fill='none' stroke='#ccc'/>")
    step = group if group > 0 and num // max(group, 1) <= 64 else max(1, num // 16)
    for i in range(0, num, step):
        out.append(
            f"<line x1='{left + i * cell}' x2='{left + i * cell}' y1='10' y2='{y0:.1f}' stroke='#ddd'/>"
            f"<text x='{left + i * cell}' y='{y0 + 14:.1f}'>{i}</text>"
        )
    out.append(f"<text x='{left}' y='{y0 + 28:.1f}' class='muted'>sample (ticks every {step})</text></svg>")
    return "".join(out)


def write_html(result: ScanResult, path: str) -> None:
    """`--html PATH`: the page of `render_html` (an unwritable path is one UserError line)."""
    files.write_text(path, render_html(result), "--html")


# ------------------------------------------------------------------------------------------- directories


def directory_summary(summaries: list) -> dict:
    """Counts over the files of a directory scan: verdicts, failures, findings, samples, tokens."""
    verdicts = {v: sum(s.would_nan == v for s in summaries) for v in ("yes", "possibly", "no")}
    return {
        "files": len(summaries),
        "failed": sum(bool(s.error or s.errors) for s in summaries),
        "would_nan": verdicts,
        "total": sum(s.total for s in summaries),
        "num_samples": sum(s.num_samples for s in summaries),
        "response_tokens": sum(s.response_tokens for s in summaries),
    }


MECHANISMS_WIDTH = 24  # the least the directory table's last column gets; narrower, each file is two lines


def _directory_row(summary, root: str) -> tuple[str, ...]:
    """A file's cells: its path under `root`, kind, format, samples, tokens, findings, verdict, mechanisms (or its
    error)."""
    name = os.path.relpath(summary.path, root)
    if summary.error:
        return (name, *("-",) * 5, "error", summary.error)
    note = ", ".join(summary.mechanisms) or "-"
    if summary.errors:
        note += f"; {len(summary.errors)} length errors (slime would fail): {summary.errors[0]}"
    return (name, summary.kind, summary.format, str(summary.num_samples), f"{summary.response_tokens:,}",
            str(summary.total), summary.would_nan, note)  # fmt: skip


def files_samples_tokens(totals: dict) -> str:
    """A directory's "3 dumps, 48 samples, 3,072 response tokens" (`directory_summary`'s totals)."""
    return ", ".join(
        words.count(totals[key], noun, grouped=True)
        for key, noun in (("files", "dump"), ("num_samples", "sample"), ("response_tokens", "response token"))
    )


def _count(cell: str, noun: str) -> str:
    """A row's count cell with its noun: "1 sample", "1,024 tokens"."""
    return f"{cell} {noun}" + ("" if cell == "1" else "s")


def render_directory(summaries: list, console, root: str) -> None:
    """One row per file (its path under `root`; verdict, findings, mechanisms, or its error), then the
    directory's summary line."""
    from rich import box  # heavy: rich, only the terminal renderers need it
    from rich.table import Table

    columns = ("file", "kind", "format", "samples", "tokens", "findings", "would NaN", "mechanisms / error")
    rows = [_directory_row(summary, root) for summary in summaries]
    fixed = sum(max([len(c)] + [len(row[i]) for row in rows]) + 3 for i, c in enumerate(columns[:-1]))
    if console.width < fixed + MECHANISMS_WIDTH:  # narrow: each file as a line, its mechanisms or error below
        from rich.padding import Padding  # heavy: rich, only the terminal renderers need it

        console.print("dumps", highlight=False, markup=False)
        for name, kind, release, samples, tokens, findings, would, note in rows:
            head = f"{name}: {kind}" if kind == "-" else (
                f"{name}: {kind} {release}, {_count(samples, 'sample')}, {_count(tokens, 'token')}, "
                f"{_count(findings, 'finding')}, would produce NaN: {would}"
            )  # fmt: skip
            console.print(Padding(_cell(head), (0, 0, 0, 1)))
            if note != "-":
                console.print(Padding(_cell(note), (0, 0, 0, 5)))
    else:
        table = Table(title="dumps", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in columns:
            table.add_column(
                column,
                justify="right" if column in ("samples", "tokens", "findings") else "left",
                no_wrap=column != "mechanisms / error",
                overflow="fold",
            )
        for row in rows:
            table.add_row(*map(_cell, row))
        console.print(table)
    totals = directory_summary(summaries)
    verdicts = totals["would_nan"]
    console.print(
        f"{files_samples_tokens(totals)}: would produce NaN: {verdicts['yes']} yes, {verdicts['possibly']} possibly, "
        f"{verdicts['no']} no; "
        f"{totals['failed']} failed; {totals['total']:,} findings",
        highlight=False,
        markup=False,
    )


def write_directory_json(summaries: list, path: str, trend: dict | None = None) -> None:
    """`--json PATH` of a directory scan: {"files": [one summary per file], "summary": directory_summary,
    "trend": the per-rollout headroom series (`nanscope.dumps.trend.trend`; nan/inf as strings)}."""
    doc = {
        "files": [{k: v for k, v in asdict(s).items() if k != "headroom"} for s in summaries],
        "summary": directory_summary(summaries),
    }
    if trend is not None:
        doc["trend"] = json_safe(trend)
    files.write_json(path, doc, "--json")


def json_safe(x):
    """`x` with every non-finite float inside it (dicts, lists) as "nan", "inf" or "-inf", as `to_json` writes them."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return _json_value(x)
