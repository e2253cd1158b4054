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
from nanscope.facts import releases
from nanscope.launch import candidates, findings, inference
from nanscope.launch.candidates import Candidate
from nanscope.launch.config import Batches, Config, Value, batches, resolve
from nanscope.launch.detect import Choice, choose
from nanscope.launch.evidence import UNKNOWN, FrameEvidence, Framework
from nanscope.launch.findings.finding import Finding
from nanscope.launch.script import LaunchScript, parse_script
from nanscope.launch.script.bounds import INPUT_LIMIT, OPTION
from nanscope.launch.topology import RankInfo, Topology, build
from nanscope.launch.tracebacks import Traceback, explain_bucket, explain_check, explain_iteration, explain_stage

_RANKS_SHOWN = 16  # other failing ranks named in the note; the rest are counted


@dataclass
class Diagnosis:
    """Everything `nanscope doctor` reports; renderers (nanscope.report.doctor) only read it and write the prose.

    Without a launch script, `script`, `config`, `topology` and `batches` are None, and so is `failing`; without a
    traceback, `traceback` is None.

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
        release: the slime release used and how it was chosen (launch.detect.Choice); None: no slime evidence.
        framework: the framework the inputs name (launch.evidence.Framework).
        inferred: values the inputs did not give and doctor inferred, each with how (launch.inference).
        missing: what each input not given would add, one line each.
        contradictions: where the inputs disagree (the frames' schedule against the script's PP, ...).
    """

    script: LaunchScript | None
    config: Config | None
    topology: Topology | None
    batches: Batches | None
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
    framework: Framework = UNKNOWN
    inferred: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)

    @property
    def evidence(self) -> FrameEvidence | None:
        return None if self.traceback is None else self.traceback.evidence


@dataclass
class _Launch:
    """A launch script read and resolved: what `diagnose` builds the layout and the rules from."""

    script: LaunchScript
    config: Config
    release: Choice
    env: dict
    inferred: list[str] = field(default_factory=list)


def diagnose(
    script_path: str | None,
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
    """Parse, resolve, lay out, and apply the rules; each input is optional, but one of script and traceback.

    Args:
        script_path: the launch script (None: the traceback alone).
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
    if script_path is None:
        assert traceback is not None, "diagnose needs a script or a traceback"
        return _without_script(traceback, rank, slime_version)
    framework = traceback.framework if traceback is not None else UNKNOWN
    hint = rank if rank is not None else _traceback_rank(traceback)
    reading = _read_launch(
        script_path,
        env=env or {},
        model=model,
        model_origin=model_origin,
        model_args=model_args,
        limit=INPUT_LIMIT if limit is None else limit,
        asked=slime_version,
        case_release=case_release,
        frames_release=(framework.release, framework.how) if framework.release is not None else None,
        rank=hint,
    )
    cfg = reading.config
    layout = build(cfg)
    figures = batches(cfg, layout.dp, layout.cp)
    found = findings.findings(cfg, figures, layout.world, layout.cp)
    colocate_ok = not any(finding.id.startswith(("rollout-gpus", "colocate")) for finding in found)
    diagnosis = Diagnosis(
        script=reading.script,
        config=cfg,
        topology=layout,
        batches=figures,
        findings=found,
        fine=findings.fine(cfg, figures, layout.world, colocate_ok),
        notes=_input_notes(reading.script, cfg, model, model_origin) + cfg.notes + layout.notes,
        model_origin=model_origin,
        env=reading.env,
        traceback=traceback,
        candidates=candidates.candidates(cfg, traceback),
        release=reading.release,
        framework=_script_framework(reading, framework),
        inferred=reading.inferred,
    )
    if traceback is None:
        diagnosis.missing.append(
            "no traceback: give it (--traceback FILE, or - for standard input) to name the failing rank, the check "
            "that fired (and so rule causes out), the framework's release and the rerun verdict"
        )
    _place_failing(diagnosis, rank, traceback_origin)
    diagnosis.contradictions = _contradictions(diagnosis)
    return diagnosis


def _traceback_rank(traceback: Traceback | None) -> int | None:
    return None if traceback is None or traceback.failure is None else traceback.failure.rank


def _script_framework(reading: _Launch, frames: Framework) -> Framework:
    """slime, with the release the diagnosis uses (a slime launch script is slime's evidence)."""
    how = f"the launch script runs {reading.script.train_script} with slime's flags"
    if frames.name == "slime":
        how = f"{frames.how}; {how}"
    return Framework("slime", reading.release.release.key, how)


def _read_launch(script_path: str, *, env: dict, model, model_origin, model_args, limit, asked, case_release,
                 frames_release, rank) -> _Launch:  # fmt: skip
    """Read and resolve the script; a node count it reads from an unset variable is inferred (launch.inference)."""
    script = parse_script(script_path, env, model_args, limit)
    text = inputs.read_text(script_path, "launch script", limit, OPTION)
    release = choose(asked, script.path, text, script.argv, case=case_release, frames=frames_release)
    kept = {placeholder.text: placeholder.reason for placeholder in script.placeholders if placeholder.kind == "limit"}

    def config_of(read: LaunchScript) -> Config:
        cfg = resolve(
            read.argv,
            model=model,
            model_origin=model_origin or "model JSON",
            unset=read.unset,
            kept=kept,
            release=release.release.key,
        )
        cfg.unread = unread(read)
        return cfg

    cfg = config_of(script)
    reading = _Launch(script, cfg, release, dict(env))
    if "actor_num_nodes" in cfg.unknown:
        _infer_nodes(
            reading, rank, lambda extra: parse_script(script_path, {**env, **extra}, model_args, limit), config_of
        )
    return reading


def _infer_nodes(reading: _Launch, rank: int | None, reparse, config_of) -> None:
    """The node count from the rank and the layout (a lower bound), and the variable that sets it when one does."""
    cfg = reading.config
    etp = cfg["expert_tensor_parallel_size"]
    sizes = inference.Sizes(
        cfg["tensor_model_parallel_size"],
        cfg["pipeline_model_parallel_size"],
        cfg["context_parallel_size"],
        cfg["expert_model_parallel_size"],
        etp,
    )
    gpn = cfg["actor_num_gpus_per_node"]
    world, why = inference.smallest_world(sizes, gpn, rank)
    nodes = world // gpn
    text = cfg.unknown["actor_num_nodes"]

    def nodes_of(extra: dict[str, str]) -> int | None:
        try:
            read = config_of(reparse(extra))
        except UserError:
            return None
        return None if "actor_num_nodes" in read.unknown else read["actor_num_nodes"]

    solved = inference.solve(list(reading.script.unset), nodes, world, nodes_of)
    bound = f"{nodes} nodes x {gpn} GPUs = world {world}, {why}: a lower bound, the rank's coordinates hold under it"
    if solved is not None:
        name, value = solved
        reading.script = reparse({name: value})
        reading.config = config_of(reading.script)
        reading.env = {**reading.env, name: value}
        origin = f"inferred: {name}={value} ({bound}); pass --env {name}=N for the real count"
        line = f"--actor-num-nodes {text!r} reads {name}, which the script never sets: inferred {name}={value}"
    else:
        origin = f"inferred: {bound}; pass --env for the real count"
        line = f"--actor-num-nodes {text!r} reads variables the script never sets: inferred {nodes}"
    reading.config.values["actor_num_nodes"] = Value(nodes, origin)
    reading.inferred.append(f"{line} ({bound})")


def unread(script: LaunchScript) -> list[tuple[str, int]]:
    """(path as written, line) of each file the script sources that nanscope did not read (Config.unread)."""
    return [(source.path, source.line) for source in script.sources if source.status == "missing"]


def _without_script(traceback: Traceback, rank: int | None, slime_version: str | None) -> Diagnosis:
    """The traceback alone: the failure, the frames' evidence and the causes the check leaves (no flags, no layout)."""
    framework = traceback.framework
    release = None
    if slime_version is not None:
        release = Choice(releases.get(slime_version), "option", f"--slime-version {slime_version}")
    elif framework.name == "slime" and framework.release is not None:
        release = Choice(releases.BY_KEY[framework.release], "frames", framework.how)
    diagnosis = Diagnosis(
        script=None,
        config=None,
        topology=None,
        batches=None,
        findings=[],
        fine=[],
        traceback=traceback,
        candidates=candidates.without_flags(traceback, framework, release),
        release=release,
        framework=framework,
    )
    failure = traceback.failure
    where = f"rank {failure.rank}" if failure is not None and failure.rank is not None else "the failing rank"
    diagnosis.missing.append(
        f"no launch script: give it to place {where} in the layout (its TP/CP/DP/PP/EP coordinates, node and "
        "layers), to read the flags that enable or rule out each cause, and to check the frames against the layout"
    )
    if rank is not None:
        diagnosis.notes.append(
            f"--rank {rank}: a rank is placed in a launch's layout; without a launch script it is not"
        )
    diagnosis.explanations = _explain_alone(traceback)
    diagnosis.notes += _traceback_notes(diagnosis, "traceback")
    return diagnosis


def _explain_alone(traceback: Traceback) -> list[str]:
    """What the traceback's failure says without a layout: its stage (from the frames), iteration, bucket, check."""
    failure, evidence = traceback.failure, traceback.evidence
    out = []
    if evidence.pp is not None:
        out.append(explain_stage(1 if evidence.pp == "1" else 2, None, failure.check if failure else None))
    if failure is None:
        return out
    if failure.iteration is not None:
        out.append(explain_iteration(failure.iteration, traceback.framework.name))
    bucket = explain_bucket(failure.bucket, None)
    if bucket:
        out.append(bucket)
    check = explain_check(failure) if failure.message else ""
    if check:
        out.append(check)
    return out


def _place_failing(diagnosis: Diagnosis, rank: int | None, traceback_origin: str) -> None:
    """Locate the asked-for (or the traceback's) rank and note where the inputs disagree."""
    traceback, layout = diagnosis.traceback, diagnosis.topology
    failure = traceback.failure if traceback is not None else None
    asked = rank if rank is not None else (failure.rank if failure is not None else None)
    if asked is not None:
        if rank is None and not 0 <= asked < layout.world:
            raise UserError(
                f"{traceback_origin}: the failing rank {asked} is outside this launch's world: "
                f"0..{layout.world - 1} (= {layout.nodes} nodes x {layout.gpus_per_node} GPUs); "
                "check --env and the script"
            )
        diagnosis.failing = layout.rank(asked)
        if rank is not None and failure is not None and failure.rank is not None and failure.rank != rank:
            diagnosis.notes.append(f"--rank {rank} overrides the traceback's rank {failure.rank}")
        device = failure.device if failure is not None else None  # "cpu": a CPU run names no GPU
        if isinstance(device, int) and asked == failure.rank and device != diagnosis.failing.local_device:
            diagnosis.notes.append(
                f"the traceback says device {failure.device} but rank {asked} maps to local device "
                f"{diagnosis.failing.local_device} with {layout.gpus_per_node} GPUs per node"
            )
        diagnosis.explanations = _explain(diagnosis)
    diagnosis.notes += _traceback_notes(diagnosis, traceback_origin)


def _traceback_notes(diagnosis: Diagnosis, traceback_origin: str) -> list[str]:
    """What the traceback says about itself: cut short, a check this launch does not run, other failing ranks."""
    traceback = diagnosis.traceback
    failure = traceback.failure if traceback is not None else None
    notes = []
    if failure is not None and failure.truncated:
        notes.append(
            f"{traceback_origin}: line {failure.line}: the Megatron error is cut short before its end; it is read "
            "as far as it goes"
        )
    if failure is not None and failure.ambiguous:
        notes.append(
            f"the message cut short fits {', '.join([failure.check.id, *failure.ambiguous])}; "
            f"read as {failure.check.id}, the likeliest"
        )
    check, cfg = (failure.check if failure is not None else None), diagnosis.config
    off = None
    if check is not None and cfg is not None and check.id == "large-grads" and not cfg["check_for_large_grads"]:
        off = "--check-for-large-grads, which this launch does not set"
    elif check is not None and cfg is not None and check.quantity == "gradient" and not cfg["check_for_nan_in_loss_and_grad"]:  # fmt: skip
        off = "--check-for-nan-in-loss-and-grad, which this launch turns off"
    if off is not None:
        notes.append(
            f"the traceback's check ({check.id}) runs only under {off}: the traceback may come from another launch"
        )
    if traceback is not None and traceback.other_ranks:
        shown, more = traceback.other_ranks[:_RANKS_SHOWN], len(traceback.other_ranks) - _RANKS_SHOWN
        first = f"the first, rank {failure.rank}, is explained" if failure is not None else "the first is explained"
        notes.append(
            f"the traceback also has Megatron errors from rank(s) {', '.join(map(str, shown))}"
            + (f" and {more} more" if more > 0 else "")
            + f"; {first}"
        )
    return notes


def _contradictions(diagnosis: Diagnosis) -> list[str]:
    """Where the traceback and the launch script disagree: stated, never ignored."""
    traceback, layout = diagnosis.traceback, diagnosis.topology
    if traceback is None or layout is None:
        return []
    out = []
    evidence, frames = traceback.evidence, traceback.framework
    pp = f"--pipeline-model-parallel-size {layout.pp}"
    if evidence.pp == "1" and layout.pp > 1:
        out.append(f"the frames run forward_backward_no_pipelining (PP 1) but the script sets {pp}")
    elif evidence.pp == ">1" and layout.pp == 1:
        out.append(f"the frames run a pipelined schedule ({evidence.schedule}: PP > 1) but the script runs PP 1")
    if evidence.vpp and not layout.vpp and layout.pp > 1:
        out.append("the frames run the interleaved schedule (virtual stages) but the script sets no virtual stages")
    elif evidence.vpp is False and evidence.pp == ">1" and layout.vpp:
        out.append(f"the frames run 1F1B without interleaving but the script sets {layout.vpp} virtual stages")
    if frames.name not in ("slime", "unknown"):
        out.append(f"the traceback's frames are {frames.name}'s ({frames.how}) but the launch script is slime's")
    chosen = diagnosis.release
    if frames.release is not None and chosen is not None and chosen.release.key != frames.release:
        out.append(
            f"the frames are slime {frames.release}'s lines but the diagnosis uses {chosen.release.key} "
            f"({chosen.how}: {chosen.source})"
        )
    return out


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
    check = traceback.failure.check if traceback is not None and traceback.failure is not None else None
    out = [explain_stage(layout.pp, failing.pp, check)]
    failure = traceback.failure if traceback is not None else None
    if failure is not None:
        if failure.iteration is not None:
            out.append(explain_iteration(failure.iteration, "slime"))
        known = failure.rank is not None and failure.rank < layout.world
        pp = layout.coords[failure.rank]["pp"] if known else failing.pp
        bucket = explain_bucket(failure.bucket, pp, diagnosis.config["overlap_grad_reduce"])
        if bucket:
            out.append(bucket)
        check_text = explain_check(failure) if failure.message else ""
        if check_text:
            out.append(check_text)
    return out
