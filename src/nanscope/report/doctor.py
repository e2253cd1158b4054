"""Rendering a `nanscope doctor` Diagnosis: JSON-ready dict, rich terminal report, self-contained HTML.

The terminal report reads top-down: verdict, failing rank, layout, findings, then what is fine,
the annotated traceback and the input notes. Layers are 0-based everywhere (Megatron's
`layer_number` is 1-based).
"""

from __future__ import annotations

from nanscope.report.html import esc, page
from nanscope.report.text import span

# The resolved flags shown in the report (all modelled flags are in the JSON's "config").
KEY_FLAGS = (
    "advantage_estimator",
    "loss_type",
    "use_kl_loss",
    "kl_loss_coef",
    "kl_loss_type",
    "entropy_coef",
    "eps_clip",
    "eps_clip_high",
    "eps_clip_c",
    "use_tis",
    "tis_clip",
    "tis_clip_low",
    "rollout_temperature",
    "check_for_nan_in_loss_and_grad",
    "rerun_mode_effective",
    "custom_generate_function_path",
    "custom_rm_path",
    "num_layers",
    "num_experts",
)

GRID_MAX_RANKS = 4096  # the HTML rank grid draws one cell per rank up to this world
MAX_STAGE_ROWS = 64  # pipeline stages listed in the terminal layout and drawn in the HTML layer split

_SEVERITY_STYLE = {
    "critical": "bold white on red",
    "high": "bold red",
    "medium": "yellow",
    "low": "cyan",
    "info": "dim",
}


def _ranks(group: list[int]) -> str:
    """A group of ranks: `48-63`, `2, 18, 34, 50`; a long strided one as `0, 8, ..., 1016 (128 ranks, every 8)`."""
    if len(group) <= 8 or group == list(range(group[0], group[-1] + 1)):
        return span(group, min_run=3)
    step = group[1] - group[0]
    if group == list(range(group[0], group[-1] + 1, step)):
        return f"{group[0]}, {group[1]}, ..., {group[-1]} ({len(group):,} ranks, every {step})"
    return ", ".join(map(str, group[:8])) + f", ... ({len(group):,} ranks)"


def _stage_text(stage) -> str:
    chunks = " | ".join(span(c.layers) for c in stage.chunks) if len(stage.chunks) > 1 else span(stage.layers)
    extras = [x for x, on in (("embedding", stage.embedding), ("final norm + output layer", stage.output)) if on]
    return chunks + (" + " + ", ".join(extras) if extras else "")


# ---- verdict ---------------------------------------------------------------------------------------


def verdict(d) -> str:
    """The report's first paragraph: where, why it died, which flags enable which mechanism."""
    parts = _rank_sentences(d) if d.failing is not None else []
    if d.traceback is not None and d.config["check_for_nan_in_loss_and_grad"]:
        parts.append(
            "The job died (instead of skipping the step) because --check-for-nan-in-loss-and-grad is on "
            "and slime runs Megatron's rerun state machine disabled."
        )
    parts.append(_findings_sentence(d.findings))
    parts.append(_candidates_sentence(d.candidates))
    return " ".join(parts)


def _rank_sentences(d) -> list[str]:
    """Where the failing (or asked-for) rank sits and what it reported."""
    r, t = d.failing, d.topology
    reported = d.traceback is not None and d.traceback.failure.rank == r.rank
    if reported:
        f = d.traceback.failure
        where = "its local gradient norm" + (f" (bucket #{f.bucket})" if f.bucket is not None else "")
        what = (
            f" found {f.kind} in {where} before the data-parallel reduce, on node {f.node} "
            f"(node index {r.node_index}), device {f.device}."
        )
    else:
        what = f" is on node index {r.node_index}, local device {r.local_device}."
        if d.traceback is not None:
            what += f" (The traceback's failing rank is {d.traceback.failure.rank}.)"
    last = r.pp == t.pp - 1
    stage = "the last pipeline stage" if last else f"pipeline stage {r.pp} of {t.pp}"
    layers = ""
    if r.layers is not None:
        layers = ", " + (f"decoder layers {span(r.layers)}" if r.layers else "no decoder layers")
        layers += " plus the final norm and output layer" if r.holds_output_layer else ""
    parts = [
        f"Rank {r.rank}{what}",
        f"It is TP {r.tp} / CP {r.cp} / DP {r.dp} / PP {r.pp} (EP {r.ep}): {stage}{layers}.",
    ]
    if last and t.pp > 1 and reported:
        parts.append(
            "The last stage holds the loss and checks its gradients first in 1F1B, so the "
            f"{d.traceback.failure.kind} can have started in any layer."
        )
    return parts


def _findings_sentence(findings: list) -> str:
    serious = [f for f in findings if f.severity in ("critical", "high")]
    if serious:
        rest = len(findings) - len(serious)
        return (
            f"The flags enable {len(serious)} high-severity mechanism(s): "
            + "; ".join(f"{f.id} ({', '.join(f.flags[:3])})" for f in serious)
            + "."
            + (f" {rest} more finding(s) below." if rest else "")
        )
    if findings:
        return f"{len(findings)} finding(s), none high-severity."
    return "No rule fired."


def _candidates_sentence(cands: list) -> str:
    """How many catalogued causes the flags leave: never one mechanism while several remain (faults in the
    model are never decided by flags, so at least two always do)."""
    from nanscope.launch.candidates import ENABLED, UNDECIDABLE, remaining

    left = remaining(cands)
    groups = [(ENABLED, "enabled by these flags"), (UNDECIDABLE, "not decidable from flags")]
    said = "; ".join(
        f"{', '.join(c.id for c in left if c.status == s)} {words}"
        for s, words in groups
        if any(c.status == s for c in left)
    )
    return (
        f"{len(left)} catalogued causes remain ({said}), so the flags alone do not say which one fired: "
        "each candidate below names the one observation that tells it apart."
    )


# ---- JSON ------------------------------------------------------------------------------------------


def to_dict(d) -> dict:
    """The JSON document (`--json PATH`)."""
    t, b, cfg = d.topology, d.batches, d.config
    out = {
        "verdict": verdict(d),
        "slime_release": release_dict(d),
        "inputs": {
            "script": d.script.path,
            "train_script": d.script.train_script,
            "train_command_line": d.script.line,
            "env": d.env,
            "model": d.model_origin,
            "sources": [
                {"path": s.path, "line": s.line, "status": s.status, "read": s.followed} for s in d.script.sources
            ],
            "unset_variables": sorted(d.script.unset),
            "placeholders": [p.text for p in d.script.placeholders],
            "argv": d.script.argv,
        },
        "config": {name: {"value": v.value, "origin": v.origin} for name, v in cfg.values.items()},
        "topology": {
            "world": t.world,
            "nodes": t.nodes,
            "gpus_per_node": t.gpus_per_node,
            "tp": t.tp,
            "pp": t.pp,
            "cp": t.cp,
            "dp": t.dp,
            "ep": t.ep,
            "etp": t.etp,
            "expert_dp": t.edp,
            "vpp": t.vpp,
            "order": t.order,
            "num_layers": t.num_layers,
            "num_experts": t.num_experts,
            "experts_per_ep_rank": t.experts_per_rank,
            "stages": None
            if t.stages is None
            else [
                {
                    "pp": s.pp,
                    "layers": s.layers,
                    "chunks": [c.layers for c in s.chunks],
                    "embedding": s.embedding,
                    "output_layer": s.output,
                }
                for s in t.stages
            ],
            "ep_groups": t.groups["ep"],
            "samples_per_rollout": b.samples_per_rollout,
            "global_batch_size": b.global_batch,
            "optimizer_steps_per_rollout": b.steps_per_rollout,
            "micro_batch_token_budget": b.budget_tokens,
            "longest_sample_tokens": b.longest_sample,
            "longest_sample_from": b.longest_from,
            "rollout_gpus": cfg["rollout_num_gpus"],
            "colocate": cfg["colocate"],
        },
        "failing_rank": None,
        "failure": None,
        "frames": [],
        "explanations": d.explanations,
        "findings": [
            {
                "id": f.id,
                "severity": f.severity,
                "title": f.title,
                "flags": f.flags,
                "mechanism": f.mechanism,
                "fix": f.fix,
                "hazards": f.hazards,
            }
            for f in d.findings
        ],
        "fine": d.fine,
        "notes": d.notes,
        "candidates": [c.to_dict() for c in d.candidates],
    }
    r = d.failing
    if r is not None:
        out["failing_rank"] = {
            "rank": r.rank,
            "tp": r.tp,
            "cp": r.cp,
            "dp": r.dp,
            "pp": r.pp,
            "ep": r.ep,
            "etp": r.etp,
            "expert_dp": r.edp,
            "node_index": r.node_index,
            "local_device": r.local_device,
            "layers": r.layers,
            "holds_output_layer": r.holds_output_layer,
            "holds_embedding": r.holds_embedding,
            "experts": r.experts,
            "groups": r.groups,
        }
    if d.traceback is not None:
        f = d.traceback.failure
        out["failure"] = {
            "rank": f.rank,
            "node": f.node,
            "device": f.device,
            "iteration": f.iteration,
            "result": f.result,
            "kind": f.kind,
            "message": f.message,
            "bucket": f.bucket,
            "truncated": f.truncated,
        }
        out["frames"] = [
            {
                "path": fr.path,
                "line": fr.line,
                "function": fr.function,
                "note": fr.note,
                "release": fr.release_text,
                "matches": fr.matches,
            }
            for fr in d.traceback.frames
        ]
    return out


def release_dict(d) -> dict:
    """The slime release the diagnosis used: its short name, full name, how it was chosen, the evidence."""
    c = d.release
    return {"version": c.release.key, "name": c.release.name, "how": c.how, "source": c.source}


def release_line(d) -> str:
    """One line: the release and how it was chosen."""
    return f"slime release {d.release.release.name} ({d.release.how}: {d.release.source})"


# ---- terminal --------------------------------------------------------------------------------------


def render_terminal(d, console) -> None:
    """Print the report on a rich Console, top-down: verdict, rank, layout, findings, the rest."""
    from rich.markup import escape
    from rich.panel import Panel

    console.print(
        f"[bold]nanscope doctor[/bold]  {escape(d.script.path)}  "
        f"([dim]{escape(d.script.train_script)}, line {d.script.line}[/dim])"
    )
    _plain(console, release_line(d))
    console.print(
        Panel(escape(verdict(d)), title="verdict", title_align="left", border_style="red" if d.traceback else "blue")
    )
    for section in (_rank_section, _layout_section, _findings_section, _flags_section, _frames_section, _notes_section):
        section(d, console)


def _plain(console, text: str) -> None:
    console.print(text, markup=False, highlight=False)


def _heading(console, title: str, rest: str = "") -> None:
    from rich.markup import escape

    console.print()
    console.print(f"[bold]{title}[/bold]" + (f" {escape(rest)}" if rest else ""))


def _rank_section(d, console) -> None:
    from rich.table import Table

    r, t = d.failing, d.topology
    if r is None:
        return
    table = Table(title=f"rank {r.rank}", title_justify="left", show_header=False, box=None, padding=(0, 2))
    layers = span(r.layers)
    if r.chunks and len(r.chunks) > 1:
        layers = " | ".join(span(c.layers) for c in r.chunks) + " (virtual stages)"
    rows = [
        ("coordinates", f"TP {r.tp} / CP {r.cp} / DP {r.dp} / PP {r.pp}   EP {r.ep} (ETP {r.etp}, expert DP {r.edp})"),
        (
            "where",
            f"node index {r.node_index} (= {r.rank} // {t.gpus_per_node}, nodes in slime's placement "
            f"order: sorted by IP), local device {r.local_device}",
        ),
        ("decoder layers", f"{layers} (0-based)"),
        ("output layer", "yes: final norm + output layer (and slime's loss)" if r.holds_output_layer else "no"),
    ]
    if r.experts:
        rows.append(("experts", f"{span(r.experts)} ({t.experts_per_rank} per EP rank)"))
    rows += [(f"{k.upper()} group", _ranks(r.groups[k])) for k in ("tp", "pp", "dp", "cp", "ep")]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    for line in d.explanations:
        _plain(console, f"  - {line}")


def _layout_section(d, console) -> None:
    from rich.table import Table

    r, t, b, cfg = d.failing, d.topology, d.batches, d.config
    _heading(
        console,
        "layout",
        f"world {t.world} = {t.nodes} nodes x {t.gpus_per_node} GPUs;  TP {t.tp}  PP {t.pp}  "
        f"CP {t.cp}  DP {t.dp} (= {t.world}/({t.tp}*{t.pp}*{t.cp}))  EP {t.ep}  ETP {t.etp}  "
        f"expert DP {t.edp}" + (f"  VPP {t.vpp}" if t.vpp else "") + f";  order {t.order}",
    )
    if t.stages is not None:
        st = Table(show_header=True, box=None, padding=(0, 2))
        for name, justify in (("PP", "left"), ("layers (0-based)", "left"), ("count", "right")):
            st.add_column(name, justify=justify)
        for s in t.stages[:MAX_STAGE_ROWS]:
            mark = " <" if r is not None and s.pp == r.pp else ""
            st.add_row(str(s.pp), _stage_text(s) + mark, str(len(s.layers)))
        console.print(st)
        if len(t.stages) > MAX_STAGE_ROWS:
            _plain(console, f"  ... {len(t.stages) - MAX_STAGE_ROWS:,} more stages (all in --json)")
    lines = []
    if t.num_experts:
        lines.append(f"experts: {t.num_experts} / EP {t.ep} = {t.experts_per_rank} per EP rank")
    if b.samples_per_rollout is not None:
        lines.append(
            f"rollout: {cfg['rollout_batch_size']} prompts x {cfg['n_samples_per_prompt']} samples = "
            f"{b.samples_per_rollout}; / global batch {b.global_batch} = {b.steps_per_rollout} optimizer "
            "step(s) per rollout"
        )
    if b.budget_tokens is not None:
        longest = b.longest_sample if b.longest_sample is not None else "unbounded"
        lines.append(
            f"micro-batch budget: max-tokens-per-gpu {cfg['max_tokens_per_gpu']} x CP {t.cp} = "
            f"{b.budget_tokens} tokens; longest sample {longest} ({b.longest_from})"
        )
    lines.append(
        f"rollout GPUs {cfg['rollout_num_gpus']} ({'colocated with' if cfg['colocate'] else 'besides'} "
        f"{t.world} actor GPUs)"
    )
    for line in lines:
        _plain(console, f"  {line}")


def _findings_section(d, console) -> None:
    from rich.markup import escape

    _heading(console, "findings", f"({len(d.findings)})")
    for f in d.findings:
        style = _SEVERITY_STYLE.get(f.severity, "")
        hazards = f"  [dim]hazards: {escape(', '.join(f.hazards))}[/dim]" if f.hazards else ""
        console.print(
            f"[{style}]{f.severity.upper()}[/{style}] [bold]{escape(f.id)}[/bold]: {escape(f.title)}{hazards}",
            highlight=False,
        )
        _plain(console, f"    evidence: {'  '.join(f.flags)}")
        _plain(console, f"    why: {f.mechanism}")
        _plain(console, f"    fix: {f.fix}")
    if d.fine:
        _heading(console, "fine")
        for line in d.fine:
            _plain(console, f"  ok  {line}")
    _candidates_section(d, console)


def _candidates_section(d, console) -> None:
    _heading(console, "candidate causes", f"({len(d.candidates)}: every cause nanscope catalogues)")
    for c in d.candidates:
        _plain(console, f"  {c.status:<11} {c.id} [{c.cause_class}]: {'; '.join(c.evidence)}")
        if c.discriminator:
            _plain(console, f"              tell it apart: {c.discriminator}")


def _flags_section(d, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    _heading(console, "resolved flags", "(value, where it came from)")
    table = Table(show_header=False, box=None, padding=(0, 2))
    for name, value, origin in key_flags(d):
        table.add_row(escape(name), escape(value), f"[dim]{escape(origin)}[/dim]")
    console.print(table)


def _frames_section(d, console) -> None:
    from rich.markup import escape

    if d.traceback is None:
        return
    _heading(console, "traceback, frame by frame", "(outermost first)")
    for fr in d.traceback.frames:
        console.print(f"  {escape(_where(fr))}  [dim]{escape(fr.release_text)}[/dim]", highlight=False)
        _plain(console, f"      {fr.note}")


def _notes_section(d, console) -> None:
    if d.notes:
        _heading(console, "inputs")
        for line in d.notes:
            _plain(console, f"  - {line}")


def key_flags(d) -> list[tuple[str, str, str]]:
    """(flag name, value, origin) for the flags that matter to the NaN mechanisms."""
    rows = []
    for name in KEY_FLAGS:
        v = d.config.values[name]
        label = "rerun mode (effective)" if name == "rerun_mode_effective" else name.replace("_", "-")
        rows.append((label, "-" if v.value is None else f"{v.value}", v.origin))
    return rows


def _where(fr) -> str:
    """`path:line function` with known library paths cut to their package-relative suffix."""
    if fr.line is None:
        return fr.function
    path = fr.known.suffix if fr.known is not None and "/" in fr.known.suffix else fr.path
    return f"{path}:{fr.line} {fr.function}"


# ---- HTML ------------------------------------------------------------------------------------------

_EP_COLOURS = ("#dbe9f6", "#e3f1dc", "#f6e7d4", "#eadcf3", "#f3dce3", "#dcf1ef", "#f1efd9", "#e2e2e2")


def rank_grid_svg(d) -> str:
    """Inline SVG: one row per PP stage; in each, DP blocks of CP blocks of TP cells (one cell per rank).

    Cells are filled by expert-parallel group; the failing rank is outlined in red.
    """
    t = d.topology
    if t.world > GRID_MAX_RANKS:
        return f"<p class='muted'>not drawn: {t.world:,} ranks (one cell per rank up to {GRID_MAX_RANKS:,})</p>"
    cols = t.dp * t.cp * t.tp
    cell_w = 40 if cols <= 32 else max(10, 1300 // cols)  # wide worlds: narrower cells, numbers in tooltips
    cell_h, gap_cp, gap_dp, label_w = 26, 6, 16, 230
    by_coord = {(c["pp"], c["dp"], c["cp"], c["tp"]): rank for rank, c in enumerate(t.coords)}
    ep_group_of = {rank: i for i, g in enumerate(t.groups["ep"]) for rank in g}
    row_w = t.dp * (t.cp * (t.tp * cell_w + gap_cp) + gap_dp)
    width, height = max(label_w + row_w + 10, 760), 40 + t.pp * (cell_h + 14) + 30
    failing = d.failing.rank if d.failing is not None else None
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        "font-family='ui-monospace,monospace' font-size='11'>"
    ]
    x0 = label_w
    for dp in range(t.dp):  # column headers
        x = x0 + dp * (t.cp * (t.tp * cell_w + gap_cp) + gap_dp)
        out.append(f"<text x='{x}' y='14'>DP {dp}</text>")
        for cp in range(t.cp):
            out.append(f"<text x='{x + cp * (t.tp * cell_w + gap_cp)}' y='28' fill='#777'>CP {cp}</text>")
    for pp in range(t.pp):
        y = 36 + pp * (cell_h + 14)
        label = f"PP {pp}"
        if t.stages is not None:
            label += ": " + _stage_text(t.stages[pp]).replace("final norm + output layer", "output")
        out.append(f"<text x='4' y='{y + 17}'>{esc(label)}</text>")
        for dp in range(t.dp):
            for cp in range(t.cp):
                for tp in range(t.tp):
                    rank = by_coord[(pp, dp, cp, tp)]
                    x = (
                        x0
                        + dp * (t.cp * (t.tp * cell_w + gap_cp) + gap_dp)
                        + cp * (t.tp * cell_w + gap_cp)
                        + tp * cell_w
                    )
                    fill = _EP_COLOURS[ep_group_of[rank] % len(_EP_COLOURS)] if t.ep > 1 else _EP_COLOURS[0]
                    stroke, sw = ("#b00020", 3) if rank == failing else ("#888", 1)
                    out.append(
                        f"<rect x='{x}' y='{y}' width='{cell_w - 2}' height='{cell_h}' fill='{fill}' "
                        f"stroke='{stroke}' stroke-width='{sw}'><title>rank {rank}: TP {tp} CP {cp} DP {dp} "
                        f"PP {pp} EP {t.coords[rank]['ep']}</title></rect>"
                    )
                    if cell_w >= 30:
                        out.append(f"<text x='{x + 4}' y='{y + 17}'>{rank}</text>")
    colour = f"fill colour = expert-parallel group (EP {t.ep}); " if t.ep > 1 else ""
    out.append(
        f"<text x='4' y='{height - 8}' fill='#777'>cells: global ranks, TP within CP within DP; {colour}"
        "red outline = failing rank</text>"
    )
    out.append("</svg>")
    return "".join(out)


def layer_split_svg(d) -> str:
    """Inline SVG: one bar per PP stage over the decoder layers 0..num_layers-1."""
    t = d.topology
    if t.stages is None or not t.num_layers:
        return "<p class='muted'>layer split unknown (num-layers not given)</p>"
    if len(t.stages) > MAX_STAGE_ROWS:
        return f"<p class='muted'>not drawn: {len(t.stages):,} pipeline stages (drawn up to {MAX_STAGE_ROWS})</p>"
    width, label_w, bar_h = 760, 70, 18
    scale = (width - label_w - 120) / t.num_layers
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{20 + t.pp * (bar_h + 6)}' "
        "font-family='ui-monospace,monospace' font-size='11'>"
    ]
    failing_pp = d.failing.pp if d.failing is not None else None
    for s in t.stages:
        y = 8 + s.pp * (bar_h + 6)
        out.append(f"<text x='4' y='{y + 13}'>PP {s.pp}</text>")
        for c in s.chunks:
            if not c.layers:
                continue
            x = label_w + c.layers[0] * scale
            fill = "#f4b6b6" if s.pp == failing_pp else "#c9dcf0"
            out.append(
                f"<rect x='{x:.1f}' y='{y}' width='{max(len(c.layers) * scale, 1):.1f}' height='{bar_h}' "
                f"fill='{fill}' stroke='#666'><title>layers {span(c.layers)}</title></rect>"
            )
            out.append(f"<text x='{x + 3:.1f}' y='{y + 13}'>{span(c.layers)}</text>")
        if s.output:
            out.append(f"<text x='{width - 115}' y='{y + 13}'>+ norm, output</text>")
    out.append("</svg>")
    return "".join(out)


def render_html(d) -> str:
    """One self-contained page: verdict, rank grid, layer split, findings, frames."""
    body = [f"<p class='muted'>{esc(release_line(d))}</p>", f"<p><b>{esc(verdict(d))}</b></p>"]
    r, t = d.failing, d.topology
    if r is not None:
        body.append("<h2>Failing rank</h2><table>")
        rows = [
            ("rank", r.rank),
            ("TP / CP / DP / PP", f"{r.tp} / {r.cp} / {r.dp} / {r.pp}"),
            ("EP", r.ep),
            ("node index / local device", f"{r.node_index} / {r.local_device}"),
            ("decoder layers (0-based)", span(r.layers)),
            ("holds output layer", r.holds_output_layer),
            ("experts", span(r.experts) if r.experts else "-"),
            ("EP group", _ranks(r.groups["ep"])),
        ]
        body += [f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in rows]
        body.append("</table><ul>" + "".join(f"<li>{esc(x)}</li>" for x in d.explanations) + "</ul>")
    body.append(
        f"<h2>Rank grid</h2><p>world {t.world} = {t.nodes} x {t.gpus_per_node}; TP {t.tp} PP {t.pp} "
        f"CP {t.cp} DP {t.dp} EP {t.ep} ETP {t.etp}; order {esc(t.order)}</p>"
    )
    body.append(rank_grid_svg(d))
    body.append("<h2>Layer split per stage</h2>" + layer_split_svg(d))
    body.append(
        "<h2>Findings</h2><table><tr><th>severity</th><th>id</th><th>evidence</th><th>mechanism</th><th>fix</th></tr>"
    )
    for f in d.findings:
        cls = " class='bad'" if f.severity in ("critical", "high") else ""
        body.append(
            f"<tr><td{cls}>{esc(f.severity)}</td><td><code>{esc(f.id)}</code><br>{esc(f.title)}"
            f"<br><span class='muted'>{esc(', '.join(f.hazards))}</span></td>"
            f"<td><code>{'<br>'.join(esc(x) for x in f.flags)}</code></td><td>{esc(f.mechanism)}</td>"
            f"<td>{esc(f.fix)}</td></tr>"
        )
    body.append("</table>")
    body.append(
        "<h2>Candidate causes</h2><table><tr><th>cause</th><th>status</th><th>evidence</th><th>tell it apart</th></tr>"
    )
    for c in d.candidates:
        body.append(
            f"<tr><td><code>{esc(c.id)}</code><br><span class='muted'>{esc(c.cause_class)}</span></td>"
            f"<td>{esc(c.status)}</td><td>{'<br>'.join(esc(x) for x in c.evidence)}</td>"
            f"<td>{esc(c.discriminator or '-')}</td></tr>"
        )
    body.append("</table>")
    body.append(
        "<h2>Resolved flags</h2><table><tr><th>flag</th><th>value</th><th>from</th></tr>"
        + "".join(
            f"<tr><td><code>{esc(n)}</code></td><td>{esc(v)}</td><td class='muted'>{esc(o)}</td></tr>"
            for n, v, o in key_flags(d)
        )
        + "</table>"
    )
    if d.fine:
        body.append("<h2>Fine</h2><ul>" + "".join(f"<li class='ok'>{esc(x)}</li>" for x in d.fine) + "</ul>")
    if d.traceback is not None:
        body.append(
            "<h2>Traceback, frame by frame</h2><table><tr><th>frame</th><th>release</th><th>what it does</th></tr>"
        )
        for fr in d.traceback.frames:
            body.append(
                f"<tr><td><code>{esc(_where(fr))}</code></td><td>{esc(fr.release_text)}</td>"
                f"<td>{esc(fr.note)}</td></tr>"
            )
        body.append("</table>")
    if d.notes:
        body.append("<h2>Inputs</h2><ul>" + "".join(f"<li>{esc(x)}</li>" for x in d.notes) + "</ul>")
    return page(f"nanscope doctor: {d.script.path}", "\n".join(body))
