"""Reading a slime launch (script, flags, layout, traceback) into a diagnosis: `nanscope doctor`'s data.

script/       launch script -> argument list (tree-sitter-bash, never executed; bash arithmetic, bounds)
config.py     argument list -> resolved flags with origins, derived batch figures
topology.py   flags -> parallel sizes, layer split, rank coordinates (megatron-core's RankGenerator)
detect.py     --slime-version / the script's text / its flags -> the slime release whose defaults apply
tracebacks.py traceback or whole job log -> failing rank, message, annotated frames (failure.py: the error
              line and its check; frames.py: the frames; logs.py: a log of any size, as a stream)
findings/     flags -> NaN mechanisms (rules, by family) and what is fine
candidates.py flags + traceback -> every catalogued cause: enabled, ruled out or undecidable, and its test
moe.py        the MoE causes' rules (router losses, zero-token experts, router logits), with megatron-core's lines
status.py     the three statuses
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.launch import candidates, findings
from nanscope.launch.candidates import Candidate
from nanscope.launch.config import Batches, Config, batches, resolve
from nanscope.launch.detect import Choice, choose
from nanscope.launch.findings.finding import Finding
from nanscope.launch.script import LaunchScript, parse_script
from nanscope.launch.script.bounds import INPUT_LIMIT, OPTION
from nanscope.launch.topology import RankInfo, Topology, build
from nanscope.launch.tracebacks import Traceback, explain_bucket, explain_check, explain_iteration, explain_stage

_RANKS_SHOWN = 16  # other failing ranks named in the note; the rest are counted


@dataclass
class Diagnosis:
    """Everything `nanscope doctor` reports; renderers (nanscope.report.doctor) only read it and write the prose.

    Attributes:
        script: the parsed launch script.
        config: resolved flags.
        topology: the actor's layout.
        batches: derived batch/length figures.
        findings: rules that fired, most severe first.
        fine: checks that passed, one line each.
        failing: the failing (or asked-for) rank, if any.
        traceback: the parsed traceback, if one was given.
        explanations: why this rank reported, what `iteration -1` and `bucket #0` mean.
        notes: inputs that were missing or overridden, in words.
        model_origin: where num-layers/num-experts came from when not in the flags.
        env: the `--env` values used.
        candidates: every catalogued cause, ruled out / enabled / undecidable by the flags and the
            traceback, with the observation that tells it apart (launch.candidates).
        release: the slime release used and how it was chosen (launch.detect.Choice).
    """

    script: LaunchScript
    config: Config
    topology: Topology
    batches: Batches
    findings: list[Finding]
    fine: list[str]
    failing: RankInfo | None = None
    traceback: Traceback | None = None
    explanations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_origin: str | None = None
    env: dict = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    release: Choice | None = None


def diagnose(
    script_path: str,
    *,
    env: dict[str, str] | None = None,
    model: dict | None = None,
    model_origin: str | None = None,
    model_args: str | None = None,
    traceback: Traceback | None = None,
    traceback_origin: str = "traceback",
    rank: int | None = None,
    limit: int | None = None,
    slime_version: str | None = None,
    case_release: str | None = None,
) -> Diagnosis:
    """Parse, resolve, lay out, and apply the rules.

    Args:
        script_path: the launch script.
        env: `--env` values (TOTAL_NODES=8, ...).
        model: architecture facts standing in for a missing model-args file.
        model_origin: how to name `model` in the report.
        model_args: a model-args file to read in place of the script's `source`.
        traceback: the parsed traceback (launch.tracebacks.read_traceback), if one was given.
        traceback_origin: its file name, for error messages.
        rank: a rank to explain (overrides the traceback's).
        limit: the most bytes read from one file (default: launch.script.bounds.INPUT_LIMIT).
        slime_version: `--slime-version` as typed, or None to detect it (launch.detect).
        case_release: the bundled case's release, when the script is the case's.

    Raises:
        UserError: any bad input, in one line.
    """
    env = env or {}
    limit = INPUT_LIMIT if limit is None else limit
    script = parse_script(script_path, env, model_args, limit)
    text = inputs.read_text(script_path, "launch script", limit, OPTION)
    release = choose(slime_version, script.path, text, script.argv, case_release)
    kept = {placeholder.text: placeholder.reason for placeholder in script.placeholders if placeholder.kind == "limit"}
    cfg = resolve(
        script.argv,
        model=model,
        model_origin=model_origin or "model JSON",
        unset=script.unset,
        kept=kept,
        release=release.release.key,
    )
    cfg.unread = unread(script)
    layout = build(cfg)
    figures = batches(cfg, layout.dp, layout.cp)
    found = findings.findings(cfg, figures, layout.world, layout.cp)
    colocate_ok = not any(finding.id.startswith(("rollout-gpus", "colocate")) for finding in found)
    diagnosis = Diagnosis(
        script=script,
        config=cfg,
        topology=layout,
        batches=figures,
        findings=found,
        fine=findings.fine(cfg, figures, layout.world, colocate_ok),
        notes=_input_notes(script, cfg, model, model_origin) + cfg.notes + layout.notes,
        model_origin=model_origin,
        env=env,
        traceback=traceback,
        candidates=candidates.candidates(cfg, traceback),
        release=release,
    )
    _place_failing(diagnosis, rank, traceback_origin)
    return diagnosis


def unread(script: LaunchScript) -> list[tuple[str, int]]:
    """(path as written, line) of each file the script sources that nanscope did not read (Config.unread)."""
    return [(source.path, source.line) for source in script.sources if source.status == "missing"]


def _place_failing(diagnosis: Diagnosis, rank: int | None, traceback_origin: str) -> None:
    """Locate the asked-for (or the traceback's) rank and note where the inputs disagree."""
    traceback, layout = diagnosis.traceback, diagnosis.topology
    asked = rank if rank is not None else (traceback.failure.rank if traceback else None)
    if asked is not None:
        if rank is None and not 0 <= asked < layout.world:
            raise UserError(
                f"{traceback_origin}: the failing rank {asked} is outside this launch's world: "
                f"0..{layout.world - 1} (= {layout.nodes} nodes x {layout.gpus_per_node} GPUs); "
                "check --env and the script"
            )
        diagnosis.failing = layout.rank(asked)
        if rank is not None and traceback and traceback.failure.rank != rank:
            diagnosis.notes.append(f"--rank {rank} overrides the traceback's rank {traceback.failure.rank}")
        device = traceback.failure.device if traceback else None  # "cpu": a CPU run names no GPU
        if isinstance(device, int) and asked == traceback.failure.rank and device != diagnosis.failing.local_device:
            diagnosis.notes.append(
                f"the traceback says device {traceback.failure.device} but rank {asked} maps to local device "
                f"{diagnosis.failing.local_device} with {layout.gpus_per_node} GPUs per node"
            )
        diagnosis.explanations = _explain(diagnosis)
    if traceback and traceback.failure.truncated:
        diagnosis.notes.append(
            f"{traceback_origin}: line {traceback.failure.line}: the Megatron error is cut short before its "
            "closing `')`; its message is read as far as it goes"
        )
    check = traceback.failure.check if traceback else None
    if check is not None and check.id == "large-grads" and not diagnosis.config["check_for_large_grads"]:
        off = "--check-for-large-grads, which this launch does not set"
    elif check is not None and check.quantity == "gradient" and not diagnosis.config["check_for_nan_in_loss_and_grad"]:
        off = "--check-for-nan-in-loss-and-grad, which this launch turns off"
    else:
        off = None
    if off is not None:
        diagnosis.notes.append(
            f"the traceback's check ({check.id}) runs only under {off}: the traceback may come from another launch"
        )
    if traceback and traceback.other_ranks:
        shown, more = traceback.other_ranks[:_RANKS_SHOWN], len(traceback.other_ranks) - _RANKS_SHOWN
        diagnosis.notes.append(
            f"the traceback also has Megatron errors from rank(s) {', '.join(map(str, shown))}"
            + (f" and {more} more" if more > 0 else "")
            + f"; the first, rank {traceback.failure.rank}, is explained"
        )


def _input_notes(script: LaunchScript, cfg: Config, model: dict | None, model_origin: str | None) -> list[str]:
    notes = []
    for source in script.sources:
        if source.status == "missing":
            where = f"; {model_origin} stands in for it" if model else "; pass --model-args FILE or --model JSON"
            notes.append(f"line {source.line}: source {source.path}: not found{where}")
        elif source.followed != source.path:
            notes.append(f"line {source.line}: source {source.path}: read {source.followed} in its place")
        else:
            notes.append(f"line {source.line}: source {source.path}: followed")
    arrays = script.unset_arrays
    scalars = [name for name in script.unset if name not in arrays]
    if arrays:
        notes.append("unset arrays expanded to nothing: " + ", ".join(arrays))
    if scalars:
        notes.append("unset variables kept as text: " + ", ".join(scalars) + " (pass --env NAME=VALUE)")
    for placeholder in script.placeholders:
        if placeholder.kind == "command":
            notes.append(f"line {placeholder.line}: {placeholder.text} is a run-time value, kept as text")
    notes += script.assumptions + script.limits
    for name in ("num_layers", "num_experts"):
        if model and cfg.origin(name) == model_origin:
            notes.append(f"{name.replace('_', '-')} {cfg[name]} from {model_origin}")
    if script.syntax_errors:
        notes.append("tree-sitter reported syntax errors at lines " + ", ".join(map(str, script.syntax_errors)))
    return notes


def _explain(diagnosis: Diagnosis) -> list[str]:
    layout, failing, traceback = diagnosis.topology, diagnosis.failing, diagnosis.traceback
    check = traceback.failure.check if traceback is not None else None
    out = [explain_stage(layout.pp, failing.pp, check)]
    if traceback is not None:
        failure = traceback.failure
        out.append(explain_iteration(failure.iteration))
        pp = layout.coords[failure.rank]["pp"] if failure.rank < layout.world else failing.pp
        bucket = explain_bucket(failure.bucket, pp, diagnosis.config["overlap_grad_reduce"])
        if bucket:
            out.append(bucket)
        check_text = explain_check(failure)
        if check_text:
            out.append(check_text)
    return out
