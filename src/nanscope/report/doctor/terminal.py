"""The doctor report on a rich Console, top-down: verdict, failing rank, layout, findings, then what is
fine, the candidate causes, the resolved flags, the annotated traceback and the input notes."""

from __future__ import annotations

from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from nanscope.facts import frameworks
from nanscope.launch.words import count
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
from nanscope.report.text import span

_SEVERITY_STYLE = {
    "critical": "bold white on red",
    "high": "bold red",
    "medium": "yellow",
    "low": "cyan",
    "info": "dim",
}


def render_terminal(diagnosis, console) -> None:
    """Print the report on a rich Console, top-down: verdict, rank, layout, findings, the rest."""
    script = diagnosis.script
    if script is not None:
        console.print(
            f"[bold]nanscope doctor[/bold]  {escape(script.path)}  "
            f"([dim]{escape(script.train_script)}, line {script.line}[/dim])"
        )
    else:
        console.print("[bold]nanscope doctor[/bold]  [dim](a log or traceback alone: no launch script)[/dim]")
    _plain(console, release_line(diagnosis))
    border = "red" if diagnosis.traceback else "blue"
    console.print(Panel(escape(verdict(diagnosis)), title="verdict", title_align="left", border_style=border))
    sections = (
        _failure_section,
        _rank_section,
        _layout_section,
        _findings_section,
        _flags_section,
        _frames_section,
        _notes_section,
    )
    for section in sections:
        section(diagnosis, console)


def _failure_section(diagnosis, console) -> None:
    """The error line's form, the releases that print it, the rerun verdict; what the frames show."""
    lines = failure_lines(diagnosis)
    if not lines:
        return
    failure = diagnosis.traceback.failure if diagnosis.traceback is not None else None
    _heading(
        console,
        "the error",
        "(as Megatron printed it)" if failure is not None and failure.signal is None else "(as the log printed it)",
    )
    for line in lines:
        _plain(console, f"  {line}")
    evidence = diagnosis.evidence
    if evidence is not None and evidence.lines:
        _heading(console, "what the frames show")
        for line in evidence.lines:
            _plain(console, f"  {line}")


def _plain(console, text: str) -> None:
    console.print(text, markup=False, highlight=False)


def _heading(console, title: str, rest: str = "") -> None:
    console.print()
    console.print(f"[bold]{title}[/bold]" + (f" {escape(rest)}" if rest else ""))


def _rank_section(diagnosis, console) -> None:
    rank, layout = diagnosis.failing, diagnosis.topology
    if rank is None:
        return
    title = f"rank {rank.rank}"
    if diagnosis.inferred:  # the world is the least the input allows (report.doctor.verdict._coordinates)
        title += (f" (at world {layout.world}, inferred: its DP and PP coordinates, node, layers and DP and PP groups "
                  "hold at that world only)")  # fmt: skip
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
    layers = span(rank.layers)
    if rank.chunks and len(rank.chunks) > 1:
        layers = " | ".join(span(chunk.layers) for chunk in rank.chunks) + " (virtual stages)"
    rows = [
        (
            "coordinates",
            f"TP {rank.tp} / CP {rank.cp} / DP {rank.dp} / PP {rank.pp}   "
            f"EP {rank.ep} (ETP {rank.etp}, expert DP {rank.edp})",
        ),
        (
            "where",
            f"node index {rank.node_index} (= {rank.rank} // {layout.gpus_per_node}, {_node_order(diagnosis)}), "
            f"local device {rank.local_device}",
        ),
        ("decoder layers", f"{layers} (0-based)"),
        (
            "output layer",
            f"yes: final norm + output layer (and {_loss_owner(diagnosis)})" if rank.holds_output_layer else "no",
        ),
    ]
    if rank.experts:
        rows.append(("experts", f"{span(rank.experts)} ({layout.experts_per_rank} per EP rank)"))
    rows += [(f"{group.upper()} group", ranks_text(rank.groups[group])) for group in ("tp", "pp", "dp", "cp", "ep")]
    for label, text in rows:
        table.add_row(label, text)
    console.print(table)
    for line in diagnosis.explanations:
        _plain(console, f"  - {line}")


def _node_order(diagnosis) -> str:
    """How nodes are numbered: slime places its Ray actors on nodes sorted by IP; elsewhere ranks fill nodes in the
    launcher's node order (torchrun's --node-rank)."""
    name = diagnosis.framework.name
    if name in (
        frameworks.SLIME,
        frameworks.VERL,
    ):  # verl: single_controller/ray/base.py sort_placement_group_by_node_ip (v0.9.0 :70)
        return f"nodes in {name}'s placement order: sorted by IP"
    if name in frameworks.MEGATRON_LOOP:
        return "nodes in the launcher's order, each filled before the next"
    return "nodes in the job's placement order, each filled before the next"


def _loss_owner(diagnosis) -> str:
    return "slime's loss" if diagnosis.framework.name == frameworks.SLIME else "the loss"


def _layout_section(diagnosis, console) -> None:
    layout = diagnosis.topology
    if layout is None:
        return
    _heading(
        console,
        "layout",
        f"world {layout.world}{' (inferred: a lower bound, see below)' if diagnosis.inferred else ''} = "
        f"{count(layout.nodes, 'node')} x {count(layout.gpus_per_node, 'GPU')};  TP {layout.tp}  "
        f"PP {layout.pp}  CP {layout.cp}  DP {layout.dp} (= {layout.world}/({layout.tp}*{layout.pp}*{layout.cp}))"
        f"  EP {layout.ep}  ETP {layout.etp}  expert DP {layout.edp}"
        + (f"  VPP {layout.vpp}" if layout.vpp else "")
        + f";  order {layout.order}",
    )
    if layout.stages is not None:
        _stages_table(diagnosis, console)
    for line in _layout_lines(diagnosis):
        _plain(console, f"  {line}")


def _stages_table(diagnosis, console) -> None:
    """One row per pipeline stage (up to MAX_STAGE_ROWS), the failing rank's marked `<`."""
    rank, stages = diagnosis.failing, diagnosis.topology.stages
    table = Table(show_header=True, box=None, padding=(0, 2))
    for name, justify in (("PP", "left"), ("layers (0-based)", "left"), ("count", "right")):
        table.add_column(name, justify=justify)
    for stage in stages[:MAX_STAGE_ROWS]:
        mark = " <" if rank is not None and stage.pp == rank.pp else ""
        table.add_row(str(stage.pp), stage_text(stage) + mark, str(len(stage.layers)))
    console.print(table)
    if len(stages) > MAX_STAGE_ROWS:
        _plain(console, f"  ... {len(stages) - MAX_STAGE_ROWS:,} more stages (all in --json)")


def _layout_lines(diagnosis) -> list[str]:
    """Experts per EP rank, optimizer steps per rollout, the micro-batch budget, the rollout GPUs."""
    layout, figures, cfg = diagnosis.topology, diagnosis.batches, diagnosis.config
    if cfg is None:  # a non-slime launch: its own flags follow
        owner = "the launch" if diagnosis.framework.name == "unknown" else diagnosis.framework.name
        return [f"{owner}'s flags: {flag}" for flag in _flag_lines(diagnosis)]
    lines = []
    if layout.num_experts:
        lines.append(f"experts: {layout.num_experts} / EP {layout.ep} = {layout.experts_per_rank} per EP rank")
    if figures.samples_per_rollout is not None:
        lines.append(
            f"rollout: {cfg['rollout_batch_size']} prompts x {cfg['n_samples_per_prompt']} samples = "
            f"{figures.samples_per_rollout}; / global batch {figures.global_batch} = {figures.steps_per_rollout} "
            "optimizer step(s) per rollout"
        )
    if figures.budget_tokens is not None:
        longest = figures.longest_sample if figures.longest_sample is not None else "unbounded"
        lines.append(
            f"micro-batch budget: max-tokens-per-gpu {cfg['max_tokens_per_gpu']} x CP {layout.cp} = "
            f"{figures.budget_tokens} tokens; longest sample {longest} ({figures.longest_from})"
        )
    lines.append(
        f"rollout GPUs {cfg['rollout_num_gpus']} ({'colocated with' if cfg['colocate'] else 'besides'} "
        f"{layout.world} actor GPUs)"
    )
    return lines


def _findings_section(diagnosis, console) -> None:
    if diagnosis.script is None:
        _candidates_section(diagnosis, console)
        return
    _heading(console, "findings", f"({len(diagnosis.findings)})")
    for finding in diagnosis.findings:
        style = _SEVERITY_STYLE.get(finding.severity, "")
        hazards = f"  [dim]hazards: {escape(', '.join(finding.hazards))}[/dim]" if finding.hazards else ""
        console.print(
            f"[{style}]{finding.severity.upper()}[/{style}] [bold]{escape(finding.id)}[/bold]: "
            f"{escape(finding.title)}{hazards}",
            highlight=False,
        )
        _plain(console, f"    evidence: {'  '.join(finding.flags)}")
        _plain(console, f"    why: {finding.mechanism}")
        _plain(console, f"    fix: {finding.fix}")
    if diagnosis.fine:
        _heading(console, "fine")
        for line in diagnosis.fine:
            _plain(console, f"  ok  {line}")
    _candidates_section(diagnosis, console)


def _candidates_section(diagnosis, console) -> None:
    # slime's job gets every catalogued cause; another stack's not slime's loss and rollouts, nor megatron-core's
    # own where nothing points to it (launch.candidates.without_flags)
    every = "every cause nanscope catalogues"
    if diagnosis.framework.name in frameworks.WITHOUT_MEGATRON:
        every = "the catalogued causes of a job without megatron-core"
    elif diagnosis.framework.name != "slime":
        every = "the catalogued causes weighed for this input"
    _heading(console, "candidate causes", f"({len(diagnosis.candidates)}: {every})")
    for candidate in diagnosis.candidates:
        evidence = "; ".join(candidate.evidence)
        _plain(console, f"  {candidate.status:<11} {candidate.id} [{candidate.cause_class}]: {evidence}")
        if candidate.discriminator:
            _plain(console, f"              tell it apart: {candidate.discriminator}")


def _flag_lines(diagnosis) -> list[str]:
    view = diagnosis.flags
    return [] if view is None else [view.show(flag) for flag in view.given]


def _flags_section(diagnosis, console) -> None:
    if diagnosis.config is None:
        if diagnosis.flags is not None and diagnosis.topology is None:
            owner = "the launch" if diagnosis.framework.name == "unknown" else diagnosis.framework.name
            _heading(console, f"{owner}'s flags", "(as the script wrote them)")
            for line in _flag_lines(diagnosis):
                _plain(console, f"  {line}")
        return
    _heading(console, "resolved flags", "(value, where it came from)")
    table = Table(show_header=False, box=None, padding=(0, 2))
    rows = key_flags(diagnosis)
    # a flag's name whole; a long value (a path, a module) folds where it has no space, never cut to an ellipsis
    table.add_column(no_wrap=True, min_width=max((len(name) for name, _, _ in rows), default=1))
    table.add_column(overflow="fold")
    table.add_column(overflow="fold")
    for name, value, origin in rows:
        table.add_row(escape(name), escape(value), f"[dim]{escape(origin)}[/dim]")
    console.print(table)


def _frames_section(diagnosis, console) -> None:
    if diagnosis.traceback is None or not diagnosis.traceback.frames:
        return
    _heading(console, "traceback, frame by frame", "(outermost first)")
    for frame in diagnosis.traceback.frames:
        console.print(f"  {escape(frame_where(frame))}  [dim]{escape(frame.release_text)}[/dim]", highlight=False)
        _plain(console, f"      {frame.note}")


def _notes_section(diagnosis, console) -> None:
    for title, lines in (
        ("contradictions", diagnosis.contradictions),
        ("inferred", diagnosis.inferred),
        ("inputs", diagnosis.notes),
        ("what the missing inputs would add", diagnosis.missing),
    ):
        if lines:
            _heading(console, title)
            for line in lines:
                _plain(console, f"  - {line}")
