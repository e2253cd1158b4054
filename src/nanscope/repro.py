"""Reproduce the case through real megatron-core on CPU, and show the fix passing: data and execution.

Three shapes of evidence, each one torchrun launch of the 4-process harness (nanscope.megatron.launcher):

- `repro_one(hazard, loss)`: one hazard under one loss, one optimizer step.
- `run_matrix()`: every hazard x {as-is, safe}; as-is must fail megatron's NaN check exactly where the
  catalogue says its gradient is non-finite, safe must complete everywhere; on healthy batches the
  two losses' gradients are compared entry by entry.
- `run_steps(hazard)`: several optimizer steps with the hazard injected at one of them; as-is dies
  there, safe completes every step, and (hazard on a masked token) safe's final parameters equal
  those of an as-is run on the hazard's defused twin. With `plugin=True` slime runs with nanscope's
  plugin installed as the README says (`PluginCheck`): the hook in raise and in skip mode, the fix
  through slime's custom-loss path, and the raise run's repro bundles replayed offline (`nanscope trace`'s
  replay: no second launch), left in a report directory.

Each takes `via` (`spec.Launcher`): torchrun (the default) or a train group of Ray actors, whose failures also
carry the driver's Ray-wrapped traceback (`Repro.traceback`). Rendering lives in nanscope.report.repro.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from nanscope import case
from nanscope.causes import catalogue
from nanscope.errors import UserError
from nanscope.launch.tracebacks import parse_traceback
from nanscope.megatron import launcher, scratch
from nanscope.megatron.spec import Launcher, Layout, RunSpec, failed_check
from nanscope.trace.observe import causal_order


@dataclass
class Repro:
    """One hazard x loss through the harness."""

    hazard: str
    loss: str
    expected: str  # "nan-check" | "completed"
    observed: str  # RunResult.observed, or "timeout"
    layout: dict
    ranks: list = field(default_factory=list)  # spec.RankRecord, by rank
    first_failure: int | None = None
    frames_match_case: bool | None = None  # every failing rank's megatron frames == the case's
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    site: list | None = None  # (sample, response position) the hazard changed, None for healthy
    site_log_probs: dict | None = None  # {"policy", "ref", "rollout"} log-probs at the site
    trace: dict | None = None  # the tracer's report on the sentinel's rank (else the first failing, else the last)
    trace_rank: int | None = None
    fault: str | None = None  # the fault planted in the model (megatron.faults), `--fault` or the hazard's
    sentinel: dict | None = None  # the sentinel's finding across ranks (`sentinel_finding`)
    traceback: str | None = None  # Ray launch: the error as its driver saw it (RayTaskError around the rank's)

    @property
    def ok(self) -> bool:
        return self.observed == self.expected

    @property
    def params_finite(self) -> bool:
        return all(record.params_finite for record in self.ranks) if self.ranks else False

    @property
    def grad_norm(self) -> float | None:
        """The optimizer's (global) grad norm of the last completed step."""
        norms = [record.optimizer_grad_norm[-1] for record in self.ranks if record.optimizer_grad_norm]
        return norms[0] if norms else None


def expected_outcome(hazard: str, loss: str, fault: str | None = None) -> str:
    """The as-is loss fails the NaN check exactly when the catalogue says its gradient is not finite; the safe
    loss where its fix lives elsewhere (a flag, the model); both where a fault is planted in the model."""
    record = catalogue.get(hazard)
    broken = not record.grad_finite if loss == "as-is" else not record.safe_finite
    return "nan-check" if broken or fault is not None else "completed"


def sentinel_finding(ranks) -> dict:
    """The sentinel's finding where the first non-finite value appeared, across ranks.

    The rank that saw it first, in causal order: a forward finding on the earliest pipeline stage (the
    forward runs stage 0 first), else the latest stage with a finding (the backward starts at the loss
    and runs back to stage 0), and within a stage the earliest in its backward (micro-batch, then the
    index of the first non-finite output-gradient check): a tensor-parallel peer that received the value
    through a collective sees it later than the rank whose module made it. With nothing non-finite
    anywhere, every field but the evidence is None.

    Returns:
        {"rank", "step", "module", "direction", "microbatch", "class", "candidates", "evidence", "expert_tokens"}
        (expert_tokens: that rank's per-expert token counts of the failing micro-batch, trace.expert_counts).
    """
    seen = [record for record in ranks if record.sentinel and record.sentinel["candidates"]]
    keys = ("step", "module", "direction", "microbatch", "class", "candidates", "evidence", "expert_tokens")
    if not seen:
        evidence = ranks[0].sentinel["evidence"] if ranks and ranks[0].sentinel else ["the sentinel did not run"]
        return {"rank": None, **dict.fromkeys(keys), "candidates": [], "evidence": evidence}
    first = min(seen, key=_causal_order)
    return {"rank": first.rank, **{key: first.sentinel.get(key) for key in keys}}


def _causal_order(record) -> tuple:
    return causal_order(
        rank=record.rank,
        pp=record.pp,
        forward=bool(record.sentinel["forward"]),
        producer=record.sentinel.get("producer"),
    )


def harness_notes(layout) -> list[str]:
    """What the CPU harness does differently from the case's GPUs, said once per report."""
    return [
        f"CPU harness: tp {layout.tp} x pp {layout.pp} x dp {layout.dp}, sequence parallel, 8 experts top-2, gloo",
        (
            f"context parallelism {layout.cp} at the loss level only (zigzag split of each sample's logits); "
            if layout.cp > 1
            else "context parallelism off (the tracer maps whole samples); "
        )
        + "attention sees whole sequences: CP inside attention needs TransformerEngine",
        "one sample per micro-batch: the local attention spec refuses packed (thd) sequences",
    ]


def from_run(run, launched, layout, expected: str | None = None) -> Repro:
    """A Repro from one run of a launch (spec.RunResult within spec.LaunchResult)."""
    spec = run.spec
    observed = "timeout" if launched.timed_out and run.observed == "incomplete" else run.observed
    failing = [record for record in run.ranks if failed_check(record)]
    first = run.first_failure()
    notes = [f"rank {rank}: no record ({launched.stuck.get(rank, 'crashed or killed')})" for rank in run.missing]
    if observed in ("incomplete", "timeout", "error"):
        notes.append("torchrun output (tail):\n" + launched.stderr_tail[-3000:])
    head = run.ranks[0] if run.ranks else None
    finding = sentinel_finding(run.ranks)
    # the rank where the non-finite value began: its tracer saw the producing op
    traced = (
        next((record for record in run.ranks if record.rank == finding["rank"]), None)
        or first
        or (run.ranks or [None])[-1]
    )
    sites = _at_inject_step(head.hazard_sites if head else [], spec.inject_step)
    site_log_probs = _at_inject_step(head.site_log_probs if head else [], spec.inject_step)
    return Repro(
        hazard=spec.hazard,
        loss=spec.loss,
        expected=expected or expected_outcome(spec.hazard, spec.loss, spec.model_fault),
        observed=observed,
        layout={"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "cp_loss_level": layout.cp},
        ranks=run.ranks,
        first_failure=first.rank if first else None,
        frames_match_case=_frames_match_case(failing, run.traceback) if failing else None,
        wall_s=launched.wall_s,
        notes=notes,
        site=sites[0] if sites else None,
        site_log_probs=site_log_probs[0] if site_log_probs else None,
        trace=traced.trace if traced else None,
        trace_rank=traced.rank if traced else None,
        fault=planted[0] if (planted := spec.planted()) else None,
        sentinel=finding,
        traceback=run.traceback,
    )


def _at_inject_step(per_step: list, inject_step: int | None) -> list:
    """The non-None entries of a per-step list, the inject step's first: a drifting hazard plants a site at every
    step, and the one that matters is where it crosses."""
    at = (inject_step or 1) - 1
    first = [per_step[at]] if at < len(per_step) and per_step[at] is not None else []
    return first + [x for i, x in enumerate(per_step) if x is not None and i != at]


def _frames_match_case(failing: list, shown: str | None) -> bool:
    """Every failing rank's megatron-core frames are the case's, and so are those of a Ray launch's traceback."""
    if not all(tuple(record.frames) == case.frames() for record in failing):
        return False
    try:
        return shown is None or parse_traceback(shown, "the Ray driver's traceback").megatron_frames() == case.frames()
    except UserError:  # no Megatron error in it
        return False


def repro_one(
    hazard: str,
    loss: str = "as-is",
    *,
    seed: int = 0,
    timeout_s: float = 300.0,
    trace: bool = False,
    fault: str | None = None,
    fault_step: int | None = None,
    fault_once: bool = False,
    via: Launcher = Launcher(),
) -> Repro:
    """Run one hazard under one loss through the 4-process harness and compare with the expectation.

    trace: replay the step under the tracer on every rank (CP 1: the tracer's token map reads whole
    samples) and report the first op that produced a non-finite value.
    fault: a fault planted in the model (megatron.faults: MODULE:forward|backward:nan|inf), firing at step
    `fault_step` (default 1; the steps before it are healthy, the hazard's batch is at that step).
    """
    layout = Layout(cp=1) if trace else Layout()
    at = fault_step or 1
    spec = RunSpec(
        hazard=hazard,
        loss=loss,
        seed=seed,
        trace=trace,
        steps=at,
        inject_step=at,
        model_fault=fault,
        model_fault_step=at if fault else None,
        model_fault_once=fault_once,
    )
    launched = launcher.launch([spec], layout, timeout_s=timeout_s, loss_flags=case.loss_flags(), via=via)
    rep = from_run(launched.runs[0], launched, layout)
    rep.notes = harness_notes(layout) + rep.notes
    return rep


def max_abs_diff(paths_a: list[str | None], paths_b: list[str | None]) -> float | None:
    """max |a - b| over every tensor of per-rank saved dicts (grads or params); None if any is missing."""
    import torch  # heavy: torch, only a several-steps check with a defused twin compares parameters

    worst = 0.0
    for path_a, path_b in zip(paths_a, paths_b):
        if not path_a or not path_b or not Path(path_a).exists() or not Path(path_b).exists():
            return None
        saved_a, saved_b = torch.load(path_a, weights_only=True), torch.load(path_b, weights_only=True)
        assert saved_a.keys() == saved_b.keys()
        for name, a in saved_a.items():
            worst = max(worst, float((a.double() - saved_b[name].double()).abs().max()) if a.numel() else 0.0)
    return worst


@dataclass
class MatrixRow:
    hazard: str
    mechanism: str
    as_is: Repro
    safe: Repro
    grad_diff: float | None = None  # max |grad safe - grad as-is| over every rank's parameters (healthy)


@dataclass
class Matrix:
    """Every hazard x {as-is, safe}."""

    rows: list[MatrixRow]
    wall_s: float
    layout: dict
    notes: list[str]

    @property
    def ok(self) -> bool:
        """as-is fails exactly where expected and safe passes everywhere."""
        return all(row.as_is.ok and row.safe.ok and row.safe.params_finite for row in self.rows)


def run_matrix(*, seed: int = 0, timeout_s: float = 600.0, via: Launcher = Launcher()) -> Matrix:
    """Every catalogue hazard under as-is and safe, in one launch (one process group for all runs)."""
    layout = Layout()
    specs = []
    for hazard in catalogue.CATALOGUE:  # on the healthy batch each rank compares safe's grads with as-is's
        healthy = hazard.name == "healthy"
        specs += [
            RunSpec(hazard=hazard.name, loss="as-is", seed=seed, save_grads=healthy),
            RunSpec(hazard=hazard.name, loss="safe", seed=seed, compare_grads=len(specs) if healthy else None),
        ]
    with scratch.directory("nanscope-matrix-") as out:  # swept by the next launch if this process is killed
        launched = launcher.launch(
            specs, layout, timeout_s=timeout_s, out_dir=out, loss_flags=case.loss_flags(), via=via
        )
        reps = [from_run(run, launched, layout) for run in launched.runs]
        rows = []
        for hazard, (as_is, safe) in zip(catalogue.CATALOGUE, zip(reps[::2], reps[1::2])):
            diffs = [record.grad_diff for record in safe.ranks]
            diff = max(diffs) if hazard.name == "healthy" and diffs and None not in diffs else None
            rows.append(MatrixRow(hazard.name, hazard.mechanism, as_is, safe, diff))
    return Matrix(rows, launched.wall_s, rows[0].as_is.layout, harness_notes(layout))


WARN_LEAD = 2  # a drift's `nanscope: warning:` comes at least this many steps before the step it kills


@dataclass
class PluginCheck:
    """slime's own loss with the plugin's hook, and the replay the hook's report asks for."""

    inject_step: int
    raised: Repro  # NANSCOPE_ON_NONFINITE=raise: megatron's check ends the hazard's step, each rank reports
    skipped: Repro  # NANSCOPE_ON_NONFINITE=skip, NANSCOPE_MAX_SKIPS as given
    max_skips: int | None
    reports: list[dict]  # the raise run's report JSONs, one per rank
    replay: dict | None  # the offline replay of the bundles (`offline_replay`): NANSCOPE_TRACE_STEP, instruction, first
    report_dir: str | None = None  # where the raise run's reports and bundles were left
    steps: int = 0  # the run's optimizer steps
    drifts: bool = False  # a drifting hazard: every step from inject_step on crosses, and the warning comes first

    @property
    def crossing_steps(self) -> int:
        """The steps whose batch makes as-is non-finite: the hazard's, or every one from it on for a drift."""
        return self.steps - self.inject_step + 1 if self.drifts else 1

    @property
    def skips_expected(self) -> int:
        """Skip mode skips the crossing steps, in a row, until NANSCOPE_MAX_SKIPS of them end the run."""
        return min(self.crossing_steps, self.max_skips or self.crossing_steps)

    @property
    def skip_expected(self) -> str:
        """A skipped step completes the run, unless NANSCOPE_MAX_SKIPS skips in a row end it there."""
        return "error" if self.max_skips is not None and self.max_skips <= self.crossing_steps else "completed"

    @property
    def warned(self) -> list[int]:
        """The harness steps (rollout + 1) at which the raise run's hook printed a `nanscope: warning:` line."""
        log = next((record.hook_log for record in self.raised.ranks if record.hook_log), [])
        return [entry["rollout_id"] + 1 for entry in log if entry.get("warnings")]

    @property
    def warned_ahead(self) -> bool:
        """A drift is warned of at least WARN_LEAD steps before the step it kills (issue 23)."""
        return bool(self.warned) and self.warned[0] <= self.inject_step - WARN_LEAD

    @property
    def ok(self) -> bool:
        """Every rank reported the hazard's step with one replay instruction; the replay found where the
        non-finite values began; skip mode skipped exactly the crossing steps (grad norm NaN) on every rank; a drift
        was warned of WARN_LEAD steps ahead."""
        steps = {
            (report["rollout_id"], report["step_id"], report["replay"]["NANSCOPE_TRACE_STEP"])
            for report in self.reports
        }
        found = self.replay is not None and any(self.replay[key] for key in ("forward", "backward", "first_forward"))
        rollout = self.inject_step - 1
        norms = [record.optimizer_grad_norm for record in self.skipped.ranks]
        skipped = all(record.skipped_steps == self.skips_expected for record in self.skipped.ranks)
        crossing = range(rollout, rollout + self.crossing_steps)
        # NaN at the crossing steps (NaN != NaN), finite at the others (or stopped there)
        skipped &= all((n != n) == (j in crossing) for per_step in norms for j, n in enumerate(per_step))
        return (
            len(self.reports) == len(self.raised.ranks)
            and steps == {(rollout, 0, f"{rollout}:0")}
            and found
            and self.skipped.observed == self.skip_expected
            and bool(self.skipped.ranks)
            and skipped
            and (self.warned_ahead or not self.drifts)
        )


@dataclass
class StepsCheck:
    """`steps` optimizer steps, the hazard injected at `inject_step`."""

    hazard: str
    steps: int
    inject_step: int
    as_is: Repro  # expected: dies at inject_step
    safe: Repro  # expected: completes every step with finite parameters
    twin: Repro | None  # as-is on the defused twin (masked-token hazards): completes
    param_diff: float | None  # max |safe params - twin params| after the last step
    wall_s: float
    notes: list[str]
    plugin: PluginCheck | None = None  # run_steps(plugin=True)

    @property
    def as_is_died_at(self) -> int | None:
        steps = {record.error_step for record in self.as_is.ranks if not record.ok}
        return min(steps) if steps else None

    @property
    def safe_steps(self) -> int:
        return min((len(record.optimizer_grad_norm) for record in self.safe.ranks), default=0)

    @property
    def ok(self) -> bool:
        ok = self.as_is.observed == "nan-check" and self.as_is_died_at == self.inject_step
        ok &= self.safe.ok and self.safe_steps == self.steps and self.safe.params_finite
        if self.twin is not None:
            ok &= self.twin.ok and self.param_diff == 0.0
        return ok and (self.plugin is None or self.plugin.ok)


def run_steps(
    hazard: str,
    *,
    steps: int = 5,
    inject_step: int = 3,
    seed: int = 0,
    timeout_s: float = 600.0,
    plugin: bool = False,
    max_skips: int | None = None,
    report_dir: str | Path | None = None,
    via: Launcher = Launcher(),
) -> StepsCheck:
    """as-is and safe over `steps` steps with `hazard` at `inject_step`, plus the defused twin.

    plugin: slime with nanscope's plugin (hook on every run; safe = the plugin's loss through slime's
        custom-loss path), a skip-mode run with NANSCOPE_MAX_SKIPS=`max_skips`, then the raise run's bundles
        replayed offline (`offline_replay`), and its reports and bundles left in `report_dir` (None: not kept);
        CP 1 (the plugin's loss, called by slime as a custom loss, reads CP from megatron's parallel state, where
        the harness has none: it simulates CP at the loss).
    """
    layout = Layout(cp=1) if plugin else Layout()
    common = dict(hazard=hazard, steps=steps, inject_step=inject_step, seed=seed)
    hook = dict(plugin=True, hook=True) if plugin else {}
    twin = catalogue.get(hazard).masked_token
    specs = [RunSpec(loss="as-is", **hook, **common), RunSpec(loss="safe", save_params=twin, **hook, **common)]
    if twin:
        specs.append(RunSpec(loss="as-is", defused=True, save_params=True, **common))
    if plugin:
        env = {"NANSCOPE_MAX_SKIPS": str(max_skips or "")}
        specs.append(RunSpec(loss="as-is", on_nonfinite="skip", env=env, **hook, **common))
    with scratch.directory("nanscope-steps-") as out:
        launched = launcher.launch(
            specs, layout, timeout_s=timeout_s, out_dir=out, loss_flags=case.loss_flags(), via=via
        )
        as_is = from_run(launched.runs[0], launched, layout)
        safe = from_run(launched.runs[1], launched, layout)
        twin_rep = from_run(launched.runs[2], launched, layout, expected="completed") if twin else None
        diff = None
        if twin:
            diff = max_abs_diff(
                [record.params_path for record in safe.ranks], [record.params_path for record in twin_rep.ranks]
            )
        check = None
        if plugin:
            skipped = from_run(launched.runs[-1], launched, layout, expected="completed")
            check = _plugin_check(as_is, skipped, inject_step=inject_step, max_skips=max_skips, report_dir=report_dir)
            check.steps, check.drifts = steps, catalogue.get(hazard).drifts
    notes = harness_notes(layout) + (
        [
            "plugin: harness step k is rollout k-1 (one optimizer step per rollout); the replay is "
            "`nanscope trace`'s, offline, of the raise run's bundles (no second harness run)"
        ]
        if plugin
        else []
    )
    return StepsCheck(
        hazard=hazard,
        steps=steps,
        inject_step=inject_step,
        as_is=as_is,
        safe=safe,
        twin=twin_rep,
        param_diff=diff,
        wall_s=launched.wall_s,
        notes=notes,
        plugin=check,
    )


def _plugin_check(
    raised: Repro, skipped: Repro, *, inject_step: int, max_skips: int | None, report_dir: str | Path | None
) -> PluginCheck:
    """Read the raise run's reports and replay its bundles offline, as `nanscope trace REPORT_DIR` does (no second
    harness run); with `report_dir`, leave the reports and bundles there (each renamed into place: a link at a name
    is replaced, never followed; a file that cannot be left there is a warning on stderr, the result kept)."""
    written = [Path(path) for record in raised.ranks for path in record.reports]
    files = [path for path in written if path.name.endswith(".json") and not path.name.endswith(".trace.json")]
    reports = [json.loads(file.read_text()) for file in files]
    check = PluginCheck(
        inject_step=inject_step, raised=raised, skipped=skipped, max_skips=max_skips, reports=reports, replay=None
    )
    if report_dir is not None and written:
        from nanscope.slime_plugin.outputs import place  # heavy: the plugin's package imports torch

        check.report_dir = str(report_dir)
        for path in written:
            place(path, report_dir, warn_with=_warn)
    bundles = sorted(path for path in written if path.name.endswith(".bundle.pt"))
    if reports and bundles:
        check.replay = offline_replay(bundles, reports[0]["replay"])
    return check


def _warn(text: str) -> None:
    print(f"nanscope repro: warning: {text}", file=sys.stderr, flush=True)


def offline_replay(bundles: list[Path], how: dict) -> dict:
    """The step's bundles replayed as `nanscope trace` replays them (`trace.bundle_step`), with the report's
    replay instruction."""
    from nanscope.trace import bundle_step  # heavy: torch

    replayed = bundle_step.replay_step(bundles)
    return {
        "NANSCOPE_TRACE_STEP": how["NANSCOPE_TRACE_STEP"],
        "instruction": how["text"],
        **replayed,
        "source": "offline: nanscope trace on the raise run's bundles",
    }
