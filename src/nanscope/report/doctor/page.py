"""The doctor report as one self-contained HTML page (`nanscope doctor --html PATH`): the verdict, the
failing rank, the rank grid and the layer split drawn as inline SVG, the findings, the candidate
causes, the resolved flags, what is fine, the traceback frame by frame and the input notes."""

from __future__ import annotations

from nanscope.report.doctor.shared import (
    MAX_STAGE_ROWS,
    failure_lines,
    frame_where,
    key_flags,
    ranks_text,
    release_line,
    stage_text,
)
from nanscope.report.doctor.verdict import verdict
from nanscope.report.html import esc, page
from nanscope.report.text import span

GRID_MAX_RANKS = 4096  # the HTML rank grid draws one cell per rank up to this world
_EP_COLOURS = ("#dbe9f6", "#e3f1dc", "#f6e7d4", "#eadcf3", "#f3dce3", "#dcf1ef", "#f1efd9", "#e2e2e2")


def rank_grid_svg(diagnosis) -> str:
    """Inline SVG: one row per PP stage; in each, DP blocks of CP blocks of TP cells (one cell per rank).

    Cells are filled by expert-parallel group; the failing rank is outlined in red.
    """
    layout = diagnosis.topology
    if layout.world > GRID_MAX_RANKS:
        return f"<p class='muted'>not drawn: {layout.world:,} ranks (one cell per rank up to {GRID_MAX_RANKS:,})</p>"
    columns = layout.dp * layout.cp * layout.tp
    cell_w = 40 if columns <= 32 else max(10, 1300 // columns)  # wide worlds: narrower cells, numbers in tooltips
    cell_h, gap_cp, gap_dp, label_w = 26, 6, 16, 230
    cp_block_w = layout.tp * cell_w + gap_cp  # one CP block: its TP cells and a gap
    dp_block_w = layout.cp * cp_block_w + gap_dp  # one DP block: its CP blocks and a gap
    coords = [layout.coord(rank) for rank in range(layout.world)]
    by_coord = {(coord["pp"], coord["dp"], coord["cp"], coord["tp"]): rank for rank, coord in enumerate(coords)}
    width, height = max(label_w + layout.dp * dp_block_w + 10, 760), 40 + layout.pp * (cell_h + 14) + 30
    failing = diagnosis.failing.rank if diagnosis.failing is not None else None
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        "font-family='ui-monospace,monospace' font-size='11'>"
    ]
    for dp in range(layout.dp):  # column headers
        x = label_w + dp * dp_block_w
        out.append(f"<text x='{x}' y='14'>DP {dp}</text>")
        for cp in range(layout.cp):
            out.append(f"<text x='{x + cp * cp_block_w}' y='28' fill='#777'>CP {cp}</text>")
    for pp in range(layout.pp):
        y = 36 + pp * (cell_h + 14)
        label = f"PP {pp}"
        if layout.stages is not None:
            label += ": " + stage_text(layout.stages[pp]).replace("final norm + output layer", "output")
        out.append(f"<text x='4' y='{y + 17}'>{esc(label)}</text>")
        for dp in range(layout.dp):
            for cp in range(layout.cp):
                for tp in range(layout.tp):
                    rank = by_coord[(pp, dp, cp, tp)]
                    x = label_w + dp * dp_block_w + cp * cp_block_w + tp * cell_w
                    fill = (
                        _EP_COLOURS[layout.group_index(rank, "ep") % len(_EP_COLOURS)]
                        if layout.ep > 1
                        else _EP_COLOURS[0]
                    )
                    stroke, stroke_w = ("#b00020", 3) if rank == failing else ("#888", 1)
                    out.append(
                        f"<rect x='{x}' y='{y}' width='{cell_w - 2}' height='{cell_h}' fill='{fill}' "
                        f"stroke='{stroke}' stroke-width='{stroke_w}'><title>rank {rank}: TP {tp} CP {cp} DP {dp} "
                        f"PP {pp} EP {coords[rank]['ep']}</title></rect>"
                    )
                    if cell_w >= 30:
                        out.append(f"<text x='{x + 4}' y='{y + 17}'>{rank}</text>")
    colour = f"fill colour = expert-parallel group (EP {layout.ep}); " if layout.ep > 1 else ""
    out.append(
        f"<text x='4' y='{height - 8}' fill='#777'>cells: global ranks, TP within CP within DP; {colour}"
        "red outline = failing rank</text>"
    )
    out.append("</svg>")
    return "".join(out)


def layer_split_svg(diagnosis) -> str:
    """Inline SVG: one bar per PP stage over the decoder layers 0..num_layers-1."""
    layout = diagnosis.topology
    if layout.stages is None or not layout.num_layers:
        return "<p class='muted'>layer split unknown (num-layers not given)</p>"
    if len(layout.stages) > MAX_STAGE_ROWS:
        return f"<p class='muted'>not drawn: {len(layout.stages):,} pipeline stages (drawn up to {MAX_STAGE_ROWS})</p>"
    width, label_w, bar_h = 760, 70, 18
    scale = (width - label_w - 120) / layout.num_layers
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{20 + layout.pp * (bar_h + 6)}' "
        "font-family='ui-monospace,monospace' font-size='11'>"
    ]
    failing_pp = diagnosis.failing.pp if diagnosis.failing is not None else None
    for stage in layout.stages:
        y = 8 + stage.pp * (bar_h + 6)
        out.append(f"<text x='4' y='{y + 13}'>PP {stage.pp}</text>")
        for chunk in stage.chunks:
            if not chunk.layers:
                continue
            x = label_w + chunk.layers[0] * scale
            fill = "#f4b6b6" if stage.pp == failing_pp else "#c9dcf0"
            out.append(
                f"<rect x='{x:.1f}' y='{y}' width='{max(len(chunk.layers) * scale, 1):.1f}' height='{bar_h}' "
                f"fill='{fill}' stroke='#666'><title>layers {span(chunk.layers)}</title></rect>"
            )
            out.append(f"<text x='{x + 3:.1f}' y='{y + 13}'>{span(chunk.layers)}</text>")
        if stage.output:
            out.append(f"<text x='{width - 115}' y='{y + 13}'>+ norm, output</text>")
    out.append("</svg>")
    return "".join(out)


def render_html(diagnosis) -> str:
    """One self-contained page: verdict, rank grid, layer split, findings, frames."""
    layout = diagnosis.topology
    body = [f"<p class='muted'>{esc(release_line(diagnosis))}</p>", f"<p><b>{esc(verdict(diagnosis))}</b></p>"]
    lines = failure_lines(diagnosis) + (diagnosis.evidence.lines if diagnosis.evidence is not None else [])
    if lines:
        body.append("<h2>The error</h2><ul>" + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>")
    body += _rank_table(diagnosis)
    if layout is not None:
        body.append(
            f"<h2>Rank grid</h2><p>world {layout.world} = {layout.nodes} x {layout.gpus_per_node}; TP {layout.tp} "
            f"PP {layout.pp} CP {layout.cp} DP {layout.dp} EP {layout.ep} ETP {layout.etp}; order {esc(layout.order)}</p>"
        )
        body.append(rank_grid_svg(diagnosis))
        body.append("<h2>Layer split per stage</h2>" + layer_split_svg(diagnosis))
        body += _findings_table(diagnosis)
    body += _candidates_table(diagnosis)
    if diagnosis.config is not None:
        body.append(
            "<h2>Resolved flags</h2><table><tr><th>flag</th><th>value</th><th>from</th></tr>"
            + "".join(
                f"<tr><td><code>{esc(name)}</code></td><td>{esc(value)}</td><td class='muted'>{esc(origin)}</td></tr>"
                for name, value, origin in key_flags(diagnosis)
            )
            + "</table>"
        )
    if diagnosis.fine:
        body.append(
            "<h2>Fine</h2><ul>" + "".join(f"<li class='ok'>{esc(line)}</li>" for line in diagnosis.fine) + "</ul>"
        )
    body += _frames_table(diagnosis)
    for title, notes in (
        ("Contradictions", diagnosis.contradictions),
        ("Inferred", diagnosis.inferred),
        ("Inputs", diagnosis.notes),
        ("What the missing inputs would add", diagnosis.missing),
    ):
        if notes:
            body.append(f"<h2>{title}</h2><ul>" + "".join(f"<li>{esc(line)}</li>" for line in notes) + "</ul>")
    name = diagnosis.script.path if diagnosis.script is not None else "a traceback"
    return page(f"nanscope doctor: {name}", "\n".join(body))


def _rank_table(diagnosis) -> list[str]:
    """The failing rank's coordinates, node, layers and EP group, and the explanations ([] without a rank)."""
    rank = diagnosis.failing
    if rank is None:
        return []
    rows = [
        ("rank", rank.rank),
        ("TP / CP / DP / PP", f"{rank.tp} / {rank.cp} / {rank.dp} / {rank.pp}"),
        ("EP", rank.ep),
        ("node index / local device", f"{rank.node_index} / {rank.local_device}"),
        ("decoder layers (0-based)", span(rank.layers)),
        ("holds output layer", rank.holds_output_layer),
        ("experts", span(rank.experts) if rank.experts else "-"),
        ("EP group", ranks_text(rank.groups["ep"])),
    ]
    return [
        "<h2>Failing rank</h2><table>",
        *(f"<tr><th>{esc(label)}</th><td>{esc(str(value))}</td></tr>" for label, value in rows),
        "</table><ul>" + "".join(f"<li>{esc(line)}</li>" for line in diagnosis.explanations) + "</ul>",
    ]


def _findings_table(diagnosis) -> list[str]:
    out = [
        "<h2>Findings</h2><table><tr><th>severity</th><th>id</th><th>evidence</th><th>mechanism</th><th>fix</th></tr>"
    ]
    for finding in diagnosis.findings:
        severity_class = " class='bad'" if finding.severity in ("critical", "high") else ""
        out.append(
            f"<tr><td{severity_class}>{esc(finding.severity)}</td><td><code>{esc(finding.id)}</code><br>"
            f"{esc(finding.title)}<br><span class='muted'>{esc(', '.join(finding.hazards))}</span></td>"
            f"<td><code>{'<br>'.join(esc(flag) for flag in finding.flags)}</code></td>"
            f"<td>{esc(finding.mechanism)}</td><td>{esc(finding.fix)}</td></tr>"
        )
    out.append("</table>")
    return out


def _candidates_table(diagnosis) -> list[str]:
    out = [
        "<h2>Candidate causes</h2><table><tr><th>cause</th><th>status</th><th>evidence</th><th>tell it apart</th></tr>"
    ]
    for candidate in diagnosis.candidates:
        out.append(
            f"<tr><td><code>{esc(candidate.id)}</code><br><span class='muted'>{esc(candidate.cause_class)}</span></td>"
            f"<td>{esc(candidate.status)}</td><td>{'<br>'.join(esc(line) for line in candidate.evidence)}</td>"
            f"<td>{esc(candidate.discriminator or '-')}</td></tr>"
        )
    out.append("</table>")
    return out


def _frames_table(diagnosis) -> list[str]:
    """The traceback frame by frame ([] without a traceback or frames)."""
    if diagnosis.traceback is None or not diagnosis.traceback.frames:
        return []
    out = ["<h2>Traceback, frame by frame</h2><table><tr><th>frame</th><th>release</th><th>what it does</th></tr>"]
    for frame in diagnosis.traceback.frames:
        out.append(
            f"<tr><td><code>{esc(frame_where(frame))}</code></td><td>{esc(frame.release_text)}</td>"
            f"<td>{esc(frame.note)}</td></tr>"
        )
    out.append("</table>")
    return out
