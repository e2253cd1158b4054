"""Reading a launch (script, flags, layout, traceback, log) into a diagnosis: `nanscope doctor`'s data.

diagnosis.py  the Diagnosis the renderers read; notes.py: the explanations, notes and contradictions in it
script/       launch script -> argument list (tree-sitter-bash, never executed; bash arithmetic, bounds)
config.py     argument list -> resolved flags with origins, derived batch figures
topology.py   flags -> parallel sizes, layer split, rank coordinates (ranks.py: RankGenerator's, by arithmetic)
detect.py     --slime-version / the script's text / its flags -> the slime release whose defaults apply
tracebacks.py traceback or whole job log -> failing rank, message, annotated frames (failure.py: the error
              line and its check; frames.py: the frames; logs.py: a log of any size, as a stream; signals.py and
              metric_lines.py: other stacks' evidence lines and metric lines, read by nonfinite.py; loose.py:
              named NaN/Inf values in any line; summary.py: what the text alone supports)
findings/     flags -> NaN mechanisms (rules, by family) and what is fine
candidates.py flags + traceback -> every catalogued cause: enabled, ruled out or undecidable, and its test
reported.py   the causes real reports had, from any framework's flags (flagview.py: one spelling for them all)
foreign.py    a launch script's framework; a non-slime launch's flags and sizes (peers.py: its causes, by its code;
              run_kind.py: what it trains, RL or not)
evidence.py   what a traceback's frames show (schedule, check reached, framework, slime release); rerun.py: the
              rerun state machine's verdict; inference.py: a node count from the rank when a variable hides it
moe.py        the MoE causes' rules (router losses, zero-token experts, router logits), with megatron-core's lines
status.py     the three statuses
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.facts import frameworks, releases
from nanscope.facts.flags import BY_NAME
from nanscope.launch import candidates, core_evidence, findings, inference, notes
from nanscope.launch.config import Config, Value, batches, resolve
from nanscope.launch.detect import Choice, choose
from nanscope.launch.diagnosis import Diagnosis
from nanscope.launch.evidence import UNKNOWN, Framework, with_core, wrapped_framework
from nanscope.launch.failure_models import with_run_kind
from nanscope.launch.findings.finding import Finding
from nanscope.launch.foreign import Foreign, read_foreign, script_framework, text_framework
from nanscope.launch.inputkind import LOG, config_framework, what_it_is
from nanscope.launch.peers import peer_candidates
from nanscope.launch.run_kind import run_kind
from nanscope.launch.script import LaunchScript, NotALaunch, parse_script
from nanscope.launch.script.bounds import INPUT_LIMIT, OPTION
from nanscope.launch.script.interpreter import NotBash
from nanscope.launch.summary import summarize
from nanscope.launch.topology import LAYERS_UNKNOWN, build
from nanscope.launch.tracebacks import Traceback, read_traceback
from nanscope.launch.words import count

__all__ = ["Diagnosis", "diagnose", "unread"]


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
    """Parse, resolve, lay out, and apply the rules (slime's to a slime launch only); one of script and traceback.

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
    if script_path is None:  # the traceback alone
        assert traceback is not None, "diagnose needs a script or a traceback"
        return _without_script(traceback, rank, slime_version)
    env, limit = env or {}, INPUT_LIMIT if limit is None else limit
    try:
        script = parse_script(script_path, env, model_args, limit)
    except (NotALaunch, NotBash) as error:
        wrapped = getattr(error, "wrapped", ())
        return _not_a_script(script_path, str(error), traceback, rank=rank, slime_version=slime_version, limit=limit,
                             wrapped=wrapped)  # fmt: skip
    text = inputs.read_text(script_path, "launch script", limit, OPTION)
    framework = script_framework(script, text)
    if framework.name != frameworks.SLIME and slime_version is None and case_release is None:
        return _foreign(script, framework, traceback, rank=rank, origin=traceback_origin, env=env)
    frames = traceback.framework if traceback is not None else UNKNOWN
    reading = _read_launch(
        script,
        text,
        env=env,
        model=model,
        model_origin=model_origin,
        model_args=model_args,
        limit=limit,
        asked=slime_version,
        case_release=case_release,
        frames_release=(frames.release, frames.how) if frames.release is not None else None,
        rank=rank if rank is not None else _traceback_rank(traceback),
    )
    diagnosis = _slime(reading, traceback, model, model_origin)
    if traceback is not None:
        _with_traceback(diagnosis, traceback)
    _place_failing(diagnosis, rank, traceback_origin)
    diagnosis.contradictions = notes.contradictions(diagnosis)
    return diagnosis


def _not_a_script(path: str, error: str, traceback: Traceback | None, *, rank, slime_version, limit,
                  wrapped: tuple[str, ...] = ()) -> Diagnosis:  # fmt: skip
    """A launch script nanscope cannot read: a job log is read as the traceback (when none is given); with a
    traceback the diagnosis is the traceback's, the script named in one line; else the one-line error, with what
    the file is."""
    kind = what_it_is(path, limit)
    note = None
    if kind == LOG and traceback is None:
        traceback, note = read_traceback(path), f"{path}: a job log, not a launch script: read as --traceback"
    if traceback is None:
        if kind is not None:
            raise UserError(f"{error}; it is {kind}, not a bash launch script (a log goes to --traceback)")
        named = text_framework(inputs.read_bytes(path, "launch script", limit)[: 1 << 16].decode("utf-8", "replace"))
        raise UserError(error + (f"; its text names {named[0]} ({named[1]})" if named else ""))
    diagnosis = _without_script(traceback, rank, slime_version)
    named = config_framework(kind) or (frameworks.NEMO if kind is not None and "NeMo-Run" in kind else None)
    if named is not None and diagnosis.framework.name in (frameworks.UNKNOWN, frameworks.TRANSFORMERS):
        diagnosis.framework = Framework(named, None, f"the file given as the launch script is {kind}")
    wrapper = wrapped_framework(wrapped)
    if wrapper is not None and diagnosis.framework.name == frameworks.UNKNOWN:
        diagnosis.framework = wrapper
    if note is None:
        what = f" ({kind})" if kind is not None and kind != LOG else ""
        note = f"launch script{what} not read: {error}; the traceback is diagnosed alone"
    diagnosis.notes.insert(0, note)
    diagnosis.unread_script = note
    return diagnosis


def _slime(reading: _Launch, traceback: Traceback | None, model: dict | None, model_origin: str | None) -> Diagnosis:
    """A slime launch: its layout, slime's rules for its flags, the catalogue's causes."""
    cfg = reading.config
    layout = build(cfg)
    figures = batches(cfg, layout.dp, layout.cp)
    found = findings.findings(cfg, figures, layout.world, layout.cp)
    colocate_ok = not any(finding.id.startswith(("rollout-gpus", "colocate")) for finding in found)
    frames = traceback.framework if traceback is not None else UNKNOWN
    return Diagnosis(
        script=reading.script,
        config=cfg,
        topology=layout,
        batches=figures,
        findings=found,
        fine=findings.fine(cfg, figures, layout.world, colocate_ok),
        notes=notes.input_notes(reading.script, cfg, model, model_origin) + cfg.notes + layout.notes,
        model_origin=model_origin,
        env=reading.env,
        traceback=traceback,
        candidates=candidates.candidates(cfg, traceback),
        release=reading.release,
        framework=_script_framework(reading, frames),
        inferred=reading.inferred,
        missing=[] if traceback is not None else [_NO_TRACEBACK],
    )


_NO_TRACEBACK = (
    "no traceback: give it (--traceback FILE, or - for standard input) to name the failing rank, the check that "
    "fired (and so rule causes out), the framework's release and the rerun verdict"
)


def _traceback_rank(traceback: Traceback | None) -> int | None:
    return None if traceback is None or traceback.failure is None else traceback.failure.rank


def _script_framework(reading: _Launch, frames: Framework) -> Framework:
    """slime, with the release the diagnosis uses (a slime launch script is slime's evidence)."""
    how = f"the launch script runs {reading.script.train_script} with slime's flags"
    if frames.name == "slime":
        how = f"{frames.how}; {how}"
    return Framework("slime", reading.release.release.key, how)


def _read_launch(script: LaunchScript, text: str, *, env: dict, model, model_origin, model_args, limit, asked,
                 case_release, frames_release, rank) -> _Launch:  # fmt: skip
    """Resolve a slime script; a node count it reads from an unset variable is inferred (launch.inference)."""
    script_path = script.path
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
    for name, text in reading.config.unknown.items():
        if name != "actor_num_nodes":
            value = reading.config[name]
            assumed = "no value assumed" if value is None else f"the default {value} assumed"
            reading.inferred.append(
                f"{BY_NAME[name].spelling} {text!r} reads variables the script never sets: unknown, {assumed} "
                "(pass --env NAME=VALUE)"
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
    bound = f"{count(nodes, 'node')} x {count(gpn, 'GPU')} = world {world}, {why}: a lower bound, the rank's coordinates hold under it"
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


def _foreign(
    script: LaunchScript, framework: Framework, traceback: Traceback | None, *, rank: int | None, origin: str, env: dict
) -> Diagnosis:
    """A launch that is not slime's: its framework's layout and flags, and the causes by its own code (launch.peers);
    no slime rule."""
    framework = _merged(framework, traceback)
    launch = read_foreign(script, framework)
    core = core_evidence.evidence(framework, traceback, script=script, view=launch.view)
    hint = rank if rank is not None else _traceback_rank(traceback)
    layout, inferred = _foreign_layout(launch, hint) if core is not None else (None, _without_layout(launch))
    # without megatron-core's layout (or past a cut in the command), a size not given is unknown, not Megatron's default
    pp, cp = (layout.pp, layout.cp) if layout and not script.cut else (launch.given("pp"), launch.given("cp"))
    kind = run_kind(script.train_script, launch.view)
    diagnosis = Diagnosis(
        script=script,
        config=None,
        topology=layout,
        batches=None,
        findings=[],
        fine=[],
        notes=launch.notes + ([] if layout is None else layout.notes),
        env=env,
        traceback=traceback,
        candidates=peer_candidates(framework, launch.view, traceback, pp=pp, cp=cp, core=core, kind=kind),
        framework=framework,
        inferred=inferred,
        flags=launch.view,
        megatron_core=core,
        run_kind=kind,
    )
    diagnosis.findings = [_not_a_size(line) for line in launch.refused]
    if traceback is None:
        diagnosis.missing.append(_NO_TRACEBACK)
    else:
        _with_traceback(diagnosis, traceback)
    if layout is not None:
        _place_failing(diagnosis, rank, origin)
    elif traceback is not None:
        diagnosis.explanations = notes.explain_alone(traceback)
        diagnosis.notes += notes.traceback_notes(diagnosis, origin)
    diagnosis.contradictions = notes.contradictions(diagnosis)
    return diagnosis


def _merged(framework: Framework, traceback: Traceback | None) -> Framework:
    """The launch script's framework, or the log's where the script names none (or names a library the log's
    framework calls: DeepSpeed under the transformers Trainer)."""
    frames = traceback.framework if traceback is not None else UNKNOWN
    if frames.name == frameworks.UNKNOWN or frames.name == framework.name or frames.name == frameworks.SLIME:
        return framework
    if framework.name == frameworks.UNKNOWN:
        return Framework(frames.name, frames.release, f"{frames.how}; the launch script names none")
    names = frameworks.NAMES
    if framework.name in (frameworks.DEEPSPEED, frameworks.TRANSFORMERS) and names.index(frames.name) < names.index(
        framework.name
    ):
        return Framework(
            frames.name, frames.release, f"{frames.how}; the launch runs {framework.name}: {framework.how}"
        )
    return framework


def _without_layout(launch: Foreign, why: str = "nothing in the inputs points to megatron-core") -> list[str]:
    """A launch nothing ties to megatron-core (or whose sizes are not read, `why`): no Megatron layout (no TP/PP/CP/EP
    to place a rank in), only the process count its launcher gives, when it gives one."""
    nodes, gpus = launch.sizes.get("nodes"), launch.sizes.get("gpus_per_node")
    name = launch.framework.name if launch.framework.name != frameworks.UNKNOWN else "the job"
    head = f"no megatron-core layout: {why}, so {name}'s ranks are not placed"
    if nodes is not None and gpus is not None:
        launch.notes.append(f"{head}; world {nodes * gpus} = {count(nodes, 'node')} x {count(gpus, 'GPU')}")
    elif gpus is not None:
        launch.notes.append(f"{head}; {count(gpus, 'process', 'processes')} a node, the node count not given")
    else:
        launch.notes.append(f"{head}; the launch gives no process count (the GPUs it sees decide it)")
    return []


def _foreign_layout(launch: Foreign, rank: int | None):
    """megatron-core's layout of a non-slime launch (None: OpenRLHF's DeepSpeed ranks, or sizes Megatron refuses),
    and what was inferred for it."""
    sizes, inferred = launch.sizes, []
    if launch.refused:  # never a default in place of a value the script gives
        launch.notes.append(f"layout not built: the script gives a value that is no size ({launch.refused[0]})")
        return None, inferred
    if launch.framework.name == frameworks.OPENRLHF:
        launch.notes.append("OpenRLHF trains with DeepSpeed: no megatron-core layout")
        return None, inferred
    if launch.recipe:  # Megatron-Bridge's performance recipe sets them (launch.bridge_perf)
        return None, _without_layout(launch, f"its recipe sets {', '.join(launch.recipe)}, not read here")
    gpn = sizes.get("gpus_per_node") or 8
    if sizes.get("gpus_per_node") is None:
        inferred.append("GPUs per node not given (nor CUDA_VISIBLE_DEVICES): 8 assumed, for the layout only")
    parallel = inference.Sizes(sizes["tp"], sizes["pp"], sizes["cp"], sizes["ep"], sizes.get("etp") or sizes["tp"])
    nodes = sizes.get("nodes")
    if nodes is None:
        world, why = inference.smallest_world(parallel, gpn, rank)
        nodes = world // gpn
        inferred.append(f"nodes not given: inferred {nodes} ({why}): a lower bound")
    argv = ["--actor-num-nodes", str(nodes), "--actor-num-gpus-per-node", str(gpn)]
    for flag, size in (("--tensor-model-parallel-size", "tp"), ("--pipeline-model-parallel-size", "pp"),
                       ("--context-parallel-size", "cp"), ("--expert-model-parallel-size", "ep"),
                       ("--expert-tensor-parallel-size", "etp")):  # fmt: skip
        if sizes.get(size) is not None:
            argv += [flag, str(sizes[size])]
    if (sizes.get("vpp") or 1) > 1:
        argv += ["--num-virtual-stages-per-pipeline-rank", str(sizes["vpp"])]
    for model in _model_flags(launch.model):  # with the model's sizes, else without those Megatron would refuse
        try:
            layout = build(resolve(argv + model))
        except UserError as error:
            launch.notes.append(f"model sizes not used ({' '.join(model)}): {error}")
            continue
        if "--num-layers" in launch.model:  # given, and said above where the split was refused
            layout.notes = [note for note in layout.notes if note != LAYERS_UNKNOWN]
        return layout, inferred
    try:
        return build(resolve(argv)), inferred
    except UserError as error:
        launch.notes.append(f"layout not built: {error}")
        return None, inferred


def _model_flags(model: dict[str, int]) -> list[list[str]]:
    """The model's sizes to lay a foreign launch out with: all of them, then the experts alone (a layer split
    Megatron would refuse keeps the experts per rank)."""
    every = [word for flag, value in model.items() for word in (flag, str(value))]
    experts = ["--num-experts", str(model["--num-experts"])] if "--num-experts" in model else []
    return [list(words) for words in dict.fromkeys(map(tuple, (every, experts))) if words]


def _not_a_size(line: str) -> Finding:
    """A value of a non-slime launch that is no size (`--num-layers -4`): a finding, never a silent default."""
    written = line.rsplit(": ", 1)[0]
    return Finding(
        id="not-a-size",
        severity="high",
        title=line,
        flags=[written],
        mechanism="Megatron refuses a size that is not a whole number >= 1 before the first step, so a run that "
        "reached a NaN did not run this value: the script is not the one that ran, or a variable changed it.",
        fix="give the value the run used (--env NAME=VALUE for a variable)",
    )


def _without_script(traceback: Traceback, rank: int | None, slime_version: str | None) -> Diagnosis:
    """The traceback alone: the failure, the frames' evidence and the causes the check leaves (no flags, no layout)."""
    framework = traceback.framework
    core = core_evidence.evidence(framework, traceback)
    framework = with_core(framework, core)  # megatron-core's error, whoever's job it was
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
        candidates=candidates.without_flags(traceback, framework, release, core),
        release=release,
        framework=framework,
        megatron_core=core,
    )
    _with_traceback(diagnosis, traceback)
    failure = traceback.failure
    diagnosis.missing.append(notes.script_adds(failure, framework))
    if rank is not None:
        diagnosis.notes.append(
            f"--rank {rank}: a rank is placed in a launch's layout; without a launch script it is not"
        )
    diagnosis.explanations = notes.explain_alone(traceback)
    diagnosis.notes += notes.traceback_notes(diagnosis, "traceback")
    return diagnosis


def _with_traceback(diagnosis: Diagnosis, traceback: Traceback) -> None:
    """What the traceback or log adds to every diagnosis: the metrics' and the evidence lines' weight on the causes,
    and the summary of what its text alone supports."""
    candidates.with_metrics(diagnosis.candidates, traceback.metrics, traceback.excursions())
    candidates.with_evidence(diagnosis.candidates, traceback)
    diagnosis.summary = summarize(traceback)
    with_run_kind(diagnosis.summary, traceback.failure, diagnosis.run_kind)


def _place_failing(diagnosis: Diagnosis, rank: int | None, traceback_origin: str) -> None:
    """Locate the asked-for (or the traceback's) rank and note where the inputs disagree."""
    traceback, layout = diagnosis.traceback, diagnosis.topology
    failure = traceback.failure if traceback is not None else None
    asked = rank if rank is not None else (failure.rank if failure is not None else None)
    if asked is not None:
        if rank is None and not 0 <= asked < layout.world:
            raise UserError(
                f"{traceback_origin}: the failing rank {asked} is outside this launch's world: "
                f"0..{layout.world - 1} (= {count(layout.nodes, 'node')} x {count(layout.gpus_per_node, 'GPU')}); "
                "check --env and the script"
            )
        diagnosis.failing = layout.rank(asked)
        if rank is not None and failure is not None and failure.rank is not None and failure.rank != rank:
            diagnosis.notes.append(f"--rank {rank} overrides the traceback's rank {failure.rank}")
        device = failure.device if failure is not None else None  # "cpu": a CPU run names no GPU
        if isinstance(device, int) and asked == failure.rank and device != diagnosis.failing.local_device:
            diagnosis.notes.append(
                f"the traceback says device {failure.device} but rank {asked} maps to local device "
                f"{diagnosis.failing.local_device} with {count(layout.gpus_per_node, 'GPU')} per node"
            )
        diagnosis.explanations = notes.explain(diagnosis)
    diagnosis.notes += notes.traceback_notes(diagnosis, traceback_origin)
