"""Reading a slime launch (script, flags, layout, traceback) into a diagnosis: `nanscope doctor`'s data.

script.py     launch script -> argument list (tree-sitter-bash, never executed)
config.py     argument list -> resolved flags with origins, derived batch figures
topology.py   flags -> parallel sizes, layer split, rank coordinates (megatron-core's RankGenerator)
detect.py     --slime-version / the script's text / its flags -> the slime release whose defaults apply
tracebacks.py traceback -> failing rank, message, annotated frames
findings.py   flags -> NaN mechanisms (rules) and what is fine
candidates.py flags + traceback -> every catalogued cause: enabled, ruled out or undecidable, and its test
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.errors import UserError


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

    script: object
    config: object
    topology: object
    batches: object
    findings: list
    fine: list[str]
    failing: object | None = None
    traceback: object | None = None
    explanations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_origin: str | None = None
    env: dict = field(default_factory=dict)
    candidates: list = field(default_factory=list)
    release: object | None = None


def diagnose(
    script_path: str,
    env: dict[str, str] | None = None,
    model: dict | None = None,
    model_origin: str | None = None,
    model_args: str | None = None,
    traceback_text: str | None = None,
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
        traceback_text: the traceback text, if any.
        traceback_origin: its file name, for error messages.
        rank: a rank to explain (overrides the traceback's).
        limit: the most bytes read from one file (default: launch.script.INPUT_LIMIT).
        slime_version: `--slime-version` as typed, or None to detect it (launch.detect).
        case_release: the bundled case's release, when the script is the case's.

    Raises:
        UserError: any bad input, in one line.
    """
    from nanscope import inputs
    from nanscope.launch import candidates as candidates_mod
    from nanscope.launch import config as config_mod
    from nanscope.launch import detect
    from nanscope.launch import topology as topology_mod
    from nanscope.launch import tracebacks as tb_mod
    from nanscope.launch.script import INPUT_LIMIT, OPTION, parse_script

    env = env or {}
    limit = INPUT_LIMIT if limit is None else limit
    tb = tb_mod.parse_traceback(traceback_text, traceback_origin) if traceback_text is not None else None
    script = parse_script(script_path, env, model_args, limit)
    text = inputs.read_text(script_path, "launch script", limit, OPTION)
    release = detect.choose(slime_version, script.path, text, script.argv, case_release)
    kept = {p.text: p.reason for p in script.placeholders if p.kind == "limit"}
    cfg = config_mod.resolve(script.argv, model, model_origin or "model JSON", script.unset, kept, release.release.key)
    topo = topology_mod.build(cfg)
    batches = config_mod.batches(cfg, topo.dp, topo.cp)
    from nanscope.launch import findings as findings_mod  # imports torch: after the inputs are known good

    found = findings_mod.findings(cfg, batches, topo.world, topo.cp)
    colocate_ok = not any(f.id.startswith(("rollout-gpus", "colocate")) for f in found)
    fine = findings_mod.fine(cfg, batches, topo.world, colocate_ok)
    notes = _input_notes(script, cfg, model, model_origin) + cfg.notes + topo.notes
    d = Diagnosis(
        script,
        cfg,
        topo,
        batches,
        found,
        fine,
        notes=notes,
        model_origin=model_origin,
        env=env,
        traceback=tb,
        candidates=candidates_mod.candidates(cfg, tb),
        release=release,
    )
    _place_failing(d, rank, traceback_origin)
    return d


def _place_failing(d: Diagnosis, rank: int | None, traceback_origin: str) -> None:
    """Locate the asked-for (or the traceback's) rank and note where the inputs disagree."""
    tb, topo = d.traceback, d.topology
    asked = rank if rank is not None else (tb.failure.rank if tb else None)
    if asked is not None:
        if rank is None and not 0 <= asked < topo.world:
            raise UserError(
                f"{traceback_origin}: the failing rank {asked} is outside this launch's world: "
                f"0..{topo.world - 1} (= {topo.nodes} nodes x {topo.gpus_per_node} GPUs); "
                "check --env and the script"
            )
        d.failing = topo.rank(asked)
        if rank is not None and tb and tb.failure.rank != rank:
            d.notes.append(f"--rank {rank} overrides the traceback's rank {tb.failure.rank}")
        if tb and asked == tb.failure.rank and tb.failure.device != d.failing.local_device:
            d.notes.append(
                f"the traceback says device {tb.failure.device} but rank {asked} maps to local device "
                f"{d.failing.local_device} with {topo.gpus_per_node} GPUs per node"
            )
        d.explanations = _explain(d)
    if tb and tb.failure.truncated:
        d.notes.append(
            f"{traceback_origin}: line {tb.failure.line}: the Megatron error is cut short before its "
            "closing `')`; its message is read as far as it goes"
        )
    if tb and tb.other_ranks:
        d.notes.append(
            f"the traceback also has Megatron errors from rank(s) {', '.join(map(str, tb.other_ranks))}; "
            f"the first, rank {tb.failure.rank}, is explained"
        )


def _input_notes(script, cfg, model, model_origin) -> list[str]:
    notes = []
    for s in script.sources:
        if s.status == "missing":
            where = f"; {model_origin} stands in for it" if model else "; pass --model-args FILE or --model JSON"
            notes.append(f"line {s.line}: source {s.path}: not found{where}")
        elif s.followed != s.path:
            notes.append(f"line {s.line}: source {s.path}: read {s.followed} in its place")
        else:
            notes.append(f"line {s.line}: source {s.path}: followed")
    arrays = script.unset_arrays
    scalars = [n for n in script.unset if n not in arrays]
    if arrays:
        notes.append("unset arrays expanded to nothing: " + ", ".join(arrays))
    if scalars:
        notes.append("unset variables kept as text: " + ", ".join(scalars) + " (pass --env NAME=VALUE)")
    for p in script.placeholders:
        if p.kind == "command":
            notes.append(f"line {p.line}: {p.text} is a run-time value, kept as text")
    notes += script.assumptions + script.limits
    for name in ("num_layers", "num_experts"):
        if model and cfg.origin(name) == model_origin:
            notes.append(f"{name.replace('_', '-')} {cfg[name]} from {model_origin}")
    if script.syntax_errors:
        notes.append("tree-sitter reported syntax errors at lines " + ", ".join(map(str, script.syntax_errors)))
    return notes


def _explain(d: Diagnosis) -> list[str]:
    from nanscope.launch import tracebacks as tb_mod

    out = [tb_mod.explain_1f1b(d.topology.pp, d.failing.pp)]
    if d.traceback is not None:
        f = d.traceback.failure
        out.append(tb_mod.explain_iteration(f.iteration))
        pp = d.topology.coords[f.rank]["pp"] if f.rank < d.topology.world else d.failing.pp
        bucket = tb_mod.explain_bucket(f.bucket, pp, d.config["overlap_grad_reduce"])
        if bucket:
            out.append(bucket)
    return out
