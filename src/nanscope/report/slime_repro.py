"""Rendering of `nanscope repro --slime-src`'s result (nanscope.slime_repro): terminal (rich) and JSON."""

from __future__ import annotations

from rich.table import Table

from nanscope.report.text import folded
from nanscope.slime_repro import AsIsCheck, PluginCheck, SlimeRepro
from nanscope.slime_train import flags
from nanscope.slime_train import run as slime_run
from nanscope.slime_train.run import STANDIN_MODULES, STANDINS
from nanscope.trace.tracer import text as trace_text


def render(rep: SlimeRepro, console) -> None:
    """What ran, what nanscope changed to run it on CPU, each launch, then the checks and the verdict.

    Text goes out as plain lines (`print`), each folded at the console's width (a flag list or a traceback's frame
    goes on below, indented; no word is cut).
    """

    def say(text: str) -> None:
        print(folded(text, console.width), flush=True)  # flushed: rich's table comes between

    result = rep.result
    lm = rep.sources.megatron_lm or "megatron.training importable here"
    say(f"slime {result.release or '(unknown release)'}: {rep.sources.slime}/train.py; Megatron-LM: {lm}")
    say(f"hazard {rep.hazard}, planted in the rollout only (sample, response position {result.site})")
    say("\n".join(setup_lines(rep)))
    if result.error:
        say(f"the run failed before train.py finished: {result.error}")
    table = Table(title="slime's train.py, on CPU (Ray, 4 logical GPUs, gloo)")
    for column in ("launch", "README plugin lines", "exit code", "seconds"):
        table.add_column(column)
    for launch in result.launches:
        lines = ", ".join(str(n) for n in _lines(launch.name)) or "-"
        seconds = f"{launch.seconds:.0f}" if launch.seconds is not None else "-"
        table.add_row(launch.name, lines, str(launch.returncode), seconds)
    console.print(table)
    lines = as_is_lines(rep.as_is) if rep.as_is is not None else []
    lines += plugin_lines(rep.plugin, rep.sources) if rep.plugin is not None else []
    lines += [f"note: {note}" for note in rep.notes] + [timing_line(rep), verdict(rep)]
    say("\n".join(lines))


def _lines(name: str) -> tuple[int, ...]:
    """The README plugin lines the launch `name` adds."""
    launches = (slime_run.AS_IS, slime_run.SENTINEL, slime_run.PLUGIN)
    return next((launch.lines for launch in launches if launch.name == name), ())


def setup_lines(rep: SlimeRepro) -> list[str]:
    """The stand-ins, the CPU patches and the flags dropped, resized and added, each with why."""
    plan = next((launch.plan for launch in rep.result.launches), None)
    out = [f"stand-ins (first on the run's PYTHONPATH, {STANDINS}): {', '.join(STANDIN_MODULES)}"]
    out.append(f"patched in every Ray worker (nanscope/megatron/cpu.py): {', '.join(rep.result.patched) or '-'}")
    out.append("patched in the driver (the stand-ins' sitecustomize): torch.cuda.get_device_properties")
    if plan is None:
        return out
    out.append(f"the case's flags kept as written: {' '.join(plan.kept)}")
    out += [f"dropped {flag}: {why}" for flag, why in plan.dropped]
    out += [f"resized {flag} {was} -> {now}: {why}" for flag, was, now, why in plan.resized]
    out += [f"added {flag}: {why}" for flag, why in plan.added]
    out.append(
        f"the model: the tiny Qwen3-MoE's args ({len(flags.model_args())} tokens; the case's model-args file was not shared)"
    )
    return out


def as_is_lines(check: AsIsCheck) -> list[str]:
    launch = check.launch
    if launch.traceback is None:
        return [
            f"as-is: train.py printed no traceback (exit code {launch.returncode}); its last output:",
            launch.stderr_tail,
        ]
    out = ["the driver's traceback (slime's train.py, as the case's job printed it):", launch.traceback.rstrip("\n")]
    if check.frames is not None:
        diff = check.frames
        state = "the case's, in the case's order" if diff.ok else "DIFFERENT from the case's"
        out.append(f"frames (slime and megatron-core, paths from slime/ and megatron/): {len(diff.run)}, {state}")
        out += [f"  missing: {path}:{line} in {func}" for path, line, func in diff.missing]
        out += [f"  not in the case: {path}:{line} in {func}" for path, line, func in diff.extra]
    out.append(f"megatron-core's message: {check.message or '-'}; Ray showed rank {check.rank}'s error first")
    return out


def plugin_lines(check: PluginCheck, sources) -> list[str]:
    out = [
        f"sentinel launch (README lines 2 and 3, NANSCOPE_ON_NONFINITE=skip): exit {check.sentinel.returncode}; "
        f"{len(check.reports)} reports, {len(check.bundles)} bundles; rerun verdict: {', '.join(check.verdicts) or '-'}"
    ]
    if check.replay is not None:
        out.append(
            f"the bundles replayed offline through {check.replay['loss']} (as `nanscope trace REPORT_DIR --slime-src {sources.slime}`):"
        )
        out += ["  " + line for line in trace_text.first_lines(check.replay)]
        out.append(f"  verdict: {check.replay['verdict']}")
    guard = ", ".join(f"{k.removeprefix('train/')} {v:g}" for k, v in check.nan_guard.items()) or "all 0"
    losses = [s["train/loss"] for s in check.plugin.steps if "train/loss" in s]  # not the hook's own step lines
    out.append(
        f"plugin launch (README lines 1-3): exit {check.plugin.returncode}; loss {losses} "
        f"({'finite' if check.loss_finite else 'NOT FINITE'}); {guard}"
    )
    out.append(f"W&B offline runs: {len(check.wandb_runs)} ({', '.join(check.wandb_runs) or '-'})")
    return out


def timing_line(rep: SlimeRepro) -> str:
    result = rep.result
    launches = ", ".join(f"{launch.name} {launch.seconds:.0f} s" for launch in result.launches if launch.seconds)
    ray = f"{result.ray_s:.0f} s" if result.ray_s is not None else "-"
    return (
        f"time: {result.wall_s:.0f} s (checkpoint and rollout {result.prepare_s:.0f} s, Ray {ray}; {launches or '-'})"
    )


def verdict(rep: SlimeRepro) -> str:
    head = "as expected" if rep.ok else "UNEXPECTED"
    if rep.result.timed_out:
        return f"{head}: the run timed out ({rep.result.wall_s:.0f} s); raise --timeout"
    if rep.as_is is not None:
        frames = "frames" if rep.as_is.case_release else "megatron-core frames (under the release's own slime lines)"
        got = f"the case's error and {frames}" if rep.as_is.ok else f"not the case's error and {frames}"
        return f"{head}: slime {rep.result.release}'s train.py as-is on {rep.hazard}: {got}"
    if rep.plugin is not None:
        got = "detected, reported, replayed; then trained through" if rep.plugin.ok else "not all of it held"
        return f"{head}: slime {rep.result.release}'s train.py with the plugin on {rep.hazard}: {got}"
    return f"{head}: no launch finished"


def to_json(rep: SlimeRepro) -> dict:
    result = rep.result
    plan = next((launch.plan for launch in result.launches), None)
    doc = {
        "mode": "slime-train",
        "ok": rep.ok,
        "release": result.release,
        "slime_src": str(rep.sources.slime),
        "megatron_lm_src": str(rep.sources.megatron_lm) if rep.sources.megatron_lm else None,
        "hazard": rep.hazard,
        "site": list(result.site) if result.site is not None else None,
        "standins": list(STANDIN_MODULES),
        "patched": {"workers": result.patched, "driver": ["torch.cuda.get_device_properties"]},
        "flags": None if plan is None else {
            "kept": list(plan.kept), "dropped": [list(d) for d in plan.dropped],
            "resized": [list(r) for r in plan.resized], "added": [list(a) for a in plan.added],
        },
        "launches": [
            {"name": launch.name, "returncode": launch.returncode, "seconds": launch.seconds, "argv": list(launch.plan.argv),
             "steps": launch.steps}
            for launch in result.launches
        ],
        "timings": {"wall_s": result.wall_s, "prepare_s": result.prepare_s, "ray_s": result.ray_s},
        "timed_out": result.timed_out,
        "error": result.error,
        "notes": rep.notes,
    }  # fmt: skip
    if rep.as_is is not None:
        doc["as_is"] = _as_is_json(rep.as_is)
    if rep.plugin is not None:
        doc["plugin"] = _plugin_json(rep.plugin)
    return doc


def _as_is_json(check: AsIsCheck) -> dict:
    frames = check.frames
    return {
        "ok": check.ok,
        "traceback": check.launch.traceback,
        "message": check.message,
        "rank": check.rank,
        "frames": None if frames is None else {
            "ok": frames.ok, "case": [list(f) for f in frames.case], "run": [list(f) for f in frames.run],
            "missing": [list(f) for f in frames.missing], "extra": [list(f) for f in frames.extra],
        },
        "stderr_tail": None if check.ok else check.launch.stderr_tail,
    }  # fmt: skip


def _plugin_json(check: PluginCheck) -> dict:
    replay = check.replay
    return {
        "ok": check.ok,
        "reports": len(check.reports),
        "bundles": check.bundles,
        "verdicts": check.verdicts,
        "replay": None if replay is None else {k: replay[k] for k in ("found", "class", "verdict", "loss", "forward", "backward", "inputs")},
        "loss_finite": check.loss_finite,
        "nan_guard": check.nan_guard,
        "wandb_runs": check.wandb_runs,
        "stderr_tail": None if check.ok else {"sentinel": check.sentinel.stderr_tail, "plugin": check.plugin.stderr_tail},
    }  # fmt: skip
