"""The JSON document of a diagnosis (`nanscope doctor --json PATH`): every figure the reports show, and all
the resolved flags with their origins. Its keys are in the order written here."""

from __future__ import annotations

from nanscope.facts import wordings
from nanscope.launch import code_lines
from nanscope.launch.topology import MAX_LISTED
from nanscope.report.doctor.shared import ranks_text
from nanscope.report.doctor.verdict import verdict


def to_dict(diagnosis) -> dict:
    """The JSON document (`--json PATH`); what an input not given would say is null (`missing` says what it adds)."""
    traceback, cfg = diagnosis.traceback, diagnosis.config
    return {
        "verdict": verdict(diagnosis),
        "summary": None if diagnosis.summary is None else diagnosis.summary.to_dict(),
        "slime_release": release_dict(diagnosis),
        "framework": diagnosis.framework.to_dict(),
        "megatron_core_evidence": diagnosis.megatron_core,
        "run_kind": None if diagnosis.run_kind is None else diagnosis.run_kind.to_dict(),
        "inputs": _inputs(diagnosis),
        "config": None
        if cfg is None
        else {name: {"value": v.value, "origin": v.origin} for name, v in cfg.values.items()},
        "topology": None if diagnosis.topology is None else _topology(diagnosis),
        "failing_rank": None if diagnosis.failing is None else _rank(diagnosis.failing),
        "failure": None if traceback is None else _failure(traceback.failure, traceback.rerun),
        "frame_evidence": None if traceback is None else traceback.evidence.to_dict(),
        "metrics": None if traceback is None else _metrics(traceback),
        "signals": None if traceback is None else traceback.nonfinite.to_dict(),
        "frames": [] if traceback is None else [_frame(frame) for frame in traceback.frames],
        "code_lines": [] if traceback is None else code_lines.to_dicts(traceback.code),
        "anomaly_forward": None if traceback is None else _forward(traceback),
        "explanations": diagnosis.explanations,
        "findings": [_finding(finding) for finding in diagnosis.findings],
        "fine": diagnosis.fine,
        "notes": diagnosis.notes,
        "framework_flags": None
        if diagnosis.flags is None
        else {f: diagnosis.flags.show(f) for f in diagnosis.flags.given},
        "inferred": diagnosis.inferred,
        "missing": diagnosis.missing,
        "contradictions": diagnosis.contradictions,
        "candidates": [candidate.to_dict() for candidate in diagnosis.candidates],
    }


def release_dict(diagnosis) -> dict | None:
    """The slime release the diagnosis used: its short name, full name, how it was chosen, the evidence (None: the
    inputs have no slime evidence)."""
    choice = diagnosis.release
    if choice is None:
        return None
    return {"version": choice.release.key, "name": choice.release.name, "how": choice.how, "source": choice.source}


def _inputs(diagnosis) -> dict:
    """What was read: the script, its train command, the values and files that stood in for others."""
    script = diagnosis.script
    if script is None:
        return {"script": None, "env": diagnosis.env, "model": diagnosis.model_origin}
    return {
        "script": script.path,
        "train_script": script.train_script,
        "train_command_line": script.line,
        "env": diagnosis.env,
        "model": diagnosis.model_origin,
        "sources": [
            {"path": source.path, "line": source.line, "status": source.status, "read": source.followed}
            for source in script.sources
        ],
        "unset_variables": sorted(script.unset),
        "placeholders": [placeholder.text for placeholder in script.placeholders],
        "argv": script.argv,
    }


def _topology(diagnosis) -> dict:
    """The parallel layout, the layer split per stage, and the batch figures of one rollout."""
    layout, figures, cfg = diagnosis.topology, diagnosis.batches, diagnosis.config
    slime = {} if cfg is None else _batch_figures(figures, cfg)
    return {
        "world": layout.world,
        "nodes": layout.nodes,
        "gpus_per_node": layout.gpus_per_node,
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "dp": layout.dp,
        "ep": layout.ep,
        "etp": layout.etp,
        "expert_dp": layout.edp,
        "vpp": layout.vpp,
        "order": layout.order,
        "num_layers": layout.num_layers,
        "num_experts": layout.num_experts,
        "experts_per_ep_rank": layout.experts_per_rank,
        "stages": None if layout.stages is None else [_stage(stage) for stage in layout.stages],
        "ep_groups": _ep_groups(layout),
        "ep_group_count": layout.world // layout.ep,
        **slime,
    }


def _ep_groups(layout) -> list[list[int]] | None:
    """Every expert-parallel group's ranks (None: a world over MAX_LISTED ranks is described, not listed)."""
    if layout.world > MAX_LISTED:
        return None
    firsts = sorted({layout.group(rank, "ep")[0]: layout.group_index(rank, "ep") for rank in range(layout.world)}.items(),
                    key=lambda item: item[1])  # fmt: skip
    return [list(layout.group(first, "ep")) for first, _ in firsts]


def _batch_figures(figures, cfg) -> dict:
    """A slime launch's batch figures of one rollout."""
    return {
        "samples_per_rollout": figures.samples_per_rollout,
        "global_batch_size": figures.global_batch,
        "optimizer_steps_per_rollout": figures.steps_per_rollout,
        "micro_batch_token_budget": figures.budget_tokens,
        "longest_sample_tokens": figures.longest_sample,
        "longest_sample_from": figures.longest_from,
        "rollout_gpus": cfg["rollout_num_gpus"],
        "colocate": cfg["colocate"],
    }


def _stage(stage) -> dict:
    return {
        "pp": stage.pp,
        "layers": stage.layers,
        "chunks": [chunk.layers for chunk in stage.chunks],
        "embedding": stage.embedding,
        "output_layer": stage.output,
    }


def _rank(rank) -> dict:
    """Where the failing (or asked-for) rank sits."""
    return {
        "rank": rank.rank,
        "tp": rank.tp,
        "cp": rank.cp,
        "dp": rank.dp,
        "pp": rank.pp,
        "ep": rank.ep,
        "etp": rank.etp,
        "expert_dp": rank.edp,
        "node_index": rank.node_index,
        "local_device": rank.local_device,
        "layers": rank.layers,
        "holds_output_layer": rank.holds_output_layer,
        "holds_embedding": rank.holds_embedding,
        "experts": rank.experts,
        "groups": {key: _listed(group) for key, group in rank.groups.items()},
        "groups_text": {key: ranks_text(group) for key, group in rank.groups.items()},
    }


def _listed(group) -> list[int] | None:
    """A group's ranks as a list (None: more than MAX_LISTED: `groups_text` describes it)."""
    return None if group is None or len(group) > MAX_LISTED else list(group)


_FAILURE_KEYS = ("rank", "node", "device", "iteration", "result", "kind", "message", "bucket", "truncated")


def _failure(failure, rerun) -> dict:
    """The traceback's Megatron error line, and the check its message names (facts.megatron.CHECKS); every key
    null when the traceback ends before its error line."""
    if failure is None:
        empty = {key: None for key in _FAILURE_KEYS} | {"check": None, "checked": None, "message_source": None}
        return empty | {"slime_runs_this_check": None, "format": None, "megatron_core": None, "rerun": _rerun(rerun)}
    check, signal = failure.check, failure.signal
    return {
        "rank": failure.rank,
        "node": failure.node,
        "device": failure.device,
        "iteration": failure.iteration,
        "result": failure.result,
        "kind": failure.kind,
        "message": failure.message,
        "bucket": failure.bucket,
        "truncated": failure.truncated,
        "check": check.id if check is not None else signal.id if signal is not None else None,
        "checked": check.quantity if check is not None else signal.quantity if signal is not None else None,
        "message_source": (
            f"{wordings.GRAD_BUFFER} ({failure.unreleased})"
            if failure.unreleased
            else check.source
            if check is not None
            else signal.source
            if signal is not None
            else None
        ),
        "slime_runs_this_check": None if check is None else check.slime,
        "format": failure.format,
        "megatron_core": _releases(failure.releases),
        "megatron_lm_main": failure.unreleased,
        "line": failure.line,
        "rank_from": failure.rank_from,
        "ambiguous": failure.ambiguous,
        "rerun": _rerun(rerun),
        "step": failure.step,
        "op": failure.op,
        "output": failure.output,
        "fatal": None if signal is None else signal.fatal,
        "means": None if signal is None else signal.means,
        "other_ranks": list(failure.ranks),
    }


def _metrics(traceback) -> dict:
    """The metric lines: the range excursions (launch.metrics), the first non-finite line and the skip counters
    (launch.metric_lines)."""
    lines = traceback.nonfinite.metrics
    return traceback.metrics.to_dict() | {
        "first_nonfinite": None if (lines.first or lines.weak) is None else (lines.first or lines.weak).to_dict(),
        "later_nonfinite_lines": lines.later,
        "graver_nonfinite": None if lines.graver is None else lines.graver.to_dict(),
        "nonfinite_again": None if lines.episodes.again is None else lines.episodes.again.to_dict(),
        "counters": [counter.to_dict() for counter in lines.counters],
        "loss_scale_fall": None if lines.scale.drop is None else _fall(lines.scale.drop),
        "loss_scale_falls": None if lines.scale.drop is None else _falls(lines.scale),
        "loss_scale_collapsed": None if lines.scale.collapsed is None else _collapsed(lines.scale),
    }


def _collapsed(printed) -> dict:
    """The first loss scale the metric lines print below 2^-10 (or an lg_loss_scale below 0: `log2`), and the line
    and step that printed it."""
    scale, (line, step) = printed.collapsed
    return {"scale": scale, "line": line, "step": step, **({"log2": printed.log2} if printed.log2 is not None else {})}


def _fall(drop) -> dict:
    """A loss scale's first fall on the metric lines: from, to, and the lines and steps that printed them."""
    high, low, (line_before, step_before), (line, step) = drop
    return {"from": high, "to": low, "line_before": line_before, "step_before": step_before, "line": line,
            "step": step}  # fmt: skip


def _falls(scale) -> dict:
    """All the falls of the loss scale the metric lines print: how many, the steps they skipped at least (and as
    halvings, where each fell by a power of two), the last fall's scale, line and step, whether the first is past a
    run's start, the first line where it fell whose skip counter says 0."""
    last, (line, step) = scale.fell
    uncounted = None if scale.uncounted is None else {"line": scale.uncounted[0], "step": scale.uncounted[1]}
    return {"falls": scale.falls, "skipped_at_least": scale.skipped,
            "halvings": None if scale.inexact else scale.skipped, "last": last, "last_line": line, "last_step": step,
            "past_start": scale.past_start(), "uncounted": uncounted}  # fmt: skip


def _rerun(rerun) -> dict | None:
    return None if rerun is None else rerun.to_dict()


def _releases(releases: tuple[str, ...]) -> dict | None:
    """The megatron-core releases that print the line: the first and the last of them, and each."""
    if not releases:
        return None
    return {"first": releases[0], "last": releases[-1], "releases": list(releases)}


def _forward(traceback) -> dict | None:
    """The last frame of the forward call anomaly mode printed (launch.anomaly), as pasted; None: none."""
    if not traceback.forward:
        return None
    frame = traceback.forward[-1]
    return {"path": frame.path, "line": frame.line, "function": frame.function, "code": frame.code or None,
            "frames": len(traceback.forward), "lines_left_out_after": traceback.forward_cut,
            "short_of_op": _short(traceback.forward_short)}  # fmt: skip


def _short(short) -> dict | None:
    """Why the forward call's frames end before the op's own call, and the last frame outside torch; None: they may
    not (launch.anomaly.short_of_op)."""
    if short is None:
        return None
    why, through = short
    came = None if through is None else {"path": through.path, "line": through.line, "function": through.function,
                                         "code": through.code or None}  # fmt: skip
    return {"why": why.split(), "came_through": came}


def _frame(frame) -> dict:
    return {
        "path": frame.path,
        "line": frame.line,
        "function": frame.function,
        "note": frame.note,
        "release": frame.release_text,
        "matches": frame.matches,
    }


def _finding(finding) -> dict:
    return {
        "id": finding.id,
        "severity": finding.severity,
        "title": finding.title,
        "flags": finding.flags,
        "mechanism": finding.mechanism,
        "fix": finding.fix,
        "hazards": finding.hazards,
    }
