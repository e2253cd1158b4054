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
  through slime's custom-loss path, and a second launch that replays the raise run's report.

Rendering lives in nanscope.report.repro.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from nanscope import case
from nanscope.causes import catalogue
from nanscope.megatron import launcher
from nanscope.megatron.spec import Layout, RunSpec, failed_check


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
        {"rank", "step", "module", "direction", "microbatch", "class", "candidates", "evidence"}.
    """
    seen = [record for record in ranks if record.sentinel and record.sentinel["candidates"]]
    keys = ("step", "module", "direction", "microbatch", "class", "candidates", "evidence")
    if not seen:
        evidence = ranks[0].sentinel["evidence"] if ranks and ranks[0].sentinel else ["the sentinel did not run"]
        return {"rank": None, **dict.fromkeys(keys), "candidates": [], "evidence": evidence}
    first = min(seen, key=_causal_order)
    return {"rank": first.rank, **{key: first.sentinel[key] for key in keys}}


def _causal_order(record) -> tuple:
    """Sort key of a rank's sentinel finding: forward findings first, by stage; then backward findings from the
    last stage back, by when they were made, then by rank."""
    if record.sentinel["forward"]:
        return (0, record.pp, record.rank)
    return (1, -record.pp, *_when(record), record.rank)


def _when(record) -> tuple[int, int]:
    """(micro-batch, output-gradient check index) of a rank's first non-finite gradient; unknown last."""
    made = record.sentinel.get("producer")
    return (made["microbatch"], made["order"]) if made else (1 << 30, 1 << 30)


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
    sites = [site for site in (head.hazard_sites if head else []) if site is not None]
    site_log_probs = [log_probs for log_probs in (head.site_log_probs if head else []) if log_probs is not None]
    return Repro(
        hazard=spec.hazard,
        loss=spec.loss,
        expected=expected or expected_outcome(spec.hazard, spec.loss, spec.model_fault),
        observed=observed,
        layout={"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "cp_loss_level": layout.cp},
        ranks=run.ranks,
        first_failure=first.rank if first else None,
        frames_match_case=all(tuple(record.frames) == case.frames() for record in failing) if failing else None,
        wall_s=launched.wall_s,
        notes=notes,
        site=sites[0] if sites else None,
        site_log_probs=site_log_probs[0] if site_log_probs else None,
        trace=traced.trace if traced else None,
        trace_rank=traced.rank if traced else None,
        fault=planted[0] if (planted := spec.planted()) else None,
        sentinel=finding,
    )


def repro_one(
    hazard: str,
    loss: str = "as-is",
    *,
    seed: int = 0,
    timeout_s: float = 300.0,
    trace: bool = False,
    fault: str | None = None,
    fault_step: int | None = None,
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
    )
    launched = launcher.launch([spec], layout, timeout_s=timeout_s, loss_flags=case.loss_flags())
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


def run_matrix(*, seed: int = 0, timeout_s: float = 600.0) -> Matrix:
    """Every catalogue hazard under as-is and safe, in one launch (one process group for all runs)."""
    layout = Layout()
    specs = []
    for hazard in catalogue.CATALOGUE:  # on the healthy batch each rank compares safe's grads with as-is's
        healthy = hazard.name == "healthy"
        specs += [
            RunSpec(hazard=hazard.name, loss="as-is", seed=seed, save_grads=healthy),
            RunSpec(hazard=hazard.name, loss="safe", seed=seed, compare_grads=len(specs) if healthy else None),
        ]
    with tempfile.TemporaryDirectory(prefix="nanscope-matrix-") as out:
        launched = launcher.launch(specs, layout, timeout_s=timeout_s, out_dir=out, loss_flags=case.loss_flags())
        reps = [from_run(run, launched, layout) for run in launched.runs]
        rows = []
        for hazard, (as_is, safe) in zip(catalogue.CATALOGUE, zip(reps[::2], reps[1::2])):
            diffs = [record.grad_diff for record in safe.ranks]
            diff = max(diffs) if hazard.name == "healthy" and diffs and None not in diffs else None
            rows.append(MatrixRow(hazard.name, hazard.mechanism, as_is, safe, diff))
    return Matrix(rows, launched.wall_s, rows[0].as_is.layout, harness_notes(layout))


@dataclass
class PluginCheck:
    """slime's own loss with the plugin's hook, and the replay the hook's report asks for."""

    inject_step: int
    raised: Repro  # NANSCOPE_ON_NONFINITE=raise: megatron's check ends the hazard's step, each rank reports
    skipped: Repro  # NANSCOPE_ON_NONFINITE=skip, NANSCOPE_MAX_SKIPS as given
    max_skips: int | None
    reports: list[dict]  # the raise run's report JSONs, one per rank
    replay: dict | None  # the replay launch: NANSCOPE_TRACE_STEP, instruction, and first_across_ranks

    @property
    def skip_expected(self) -> str:
        """A skipped step completes the run, unless NANSCOPE_MAX_SKIPS=1 ends it there."""
        return "error" if self.max_skips == 1 else "completed"

    @property
    def ok(self) -> bool:
        """Every rank reported the hazard's step with one replay instruction; the replay found where the
        non-finite values began; skip mode skipped exactly that step (grad norm NaN) on every rank."""
        steps = {
            (report["rollout_id"], report["step_id"], report["replay"]["NANSCOPE_TRACE_STEP"])
            for report in self.reports
        }
        found = self.replay is not None and any(self.replay[key] for key in ("forward", "backward", "first_forward"))
        rollout = self.inject_step - 1
        norms = [record.optimizer_grad_norm for record in self.skipped.ranks]
        skipped = all(record.skipped_steps == 1 for record in self.skipped.ranks)
        # NaN at the skipped step (or stopped there)
        skipped &= all(len(per_step) == rollout or per_step[rollout] != per_step[rollout] for per_step in norms)
        return (
            len(self.reports) == len(self.raised.ranks)
            and steps == {(rollout, 0, f"{rollout}:0")}
            and found
            and self.skipped.observed == self.skip_expected
            and bool(self.skipped.ranks)
            and skipped
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
) -> StepsCheck:
    """as-is and safe over `steps` steps with `hazard` at `inject_step`, plus the defused twin.

    plugin: slime with nanscope's plugin (hook on every run; safe = the plugin's loss through slime's
        custom-loss path), a skip-mode run with NANSCOPE_MAX_SKIPS=`max_skips`, then the replay of the
        raise run's report in a second launch; CP 1 (the tracer maps whole samples).
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
    with tempfile.TemporaryDirectory(prefix="nanscope-steps-") as out:
        launched = launcher.launch(specs, layout, timeout_s=timeout_s, out_dir=out, loss_flags=case.loss_flags())
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
            check = _plugin_check(
                as_is,
                skipped,
                seed=seed,
                inject_step=inject_step,
                max_skips=max_skips,
                out=Path(out) / "replay",
                timeout_s=timeout_s,
            )
    notes = harness_notes(layout) + (
        [
            "plugin: harness step k is rollout k-1 (one optimizer step per rollout); "
            "the replay rebuilds each step's batch from its seed, as the saved rollout "
            "holds it"
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
    raised: Repro, skipped: Repro, *, seed: int, inject_step: int, max_skips: int | None, out: Path, timeout_s: float
) -> PluginCheck:
    """Read the raise run's reports and run the replay each one prints: NANSCOPE_TRACE_STEP with the
    saved rollouts as --load-debug-rollout-data."""
    files = [Path(path) for record in raised.ranks for path in record.reports if not path.endswith(".trace.json")]
    reports = [json.loads(file.read_text()) for file in files]
    check = PluginCheck(
        inject_step=inject_step, raised=raised, skipped=skipped, max_skips=max_skips, reports=reports, replay=None
    )
    if not reports:
        return check
    how = reports[0]["replay"]
    spec = RunSpec(
        hazard=raised.hazard,
        loss=raised.loss,
        steps=inject_step,
        inject_step=inject_step,
        seed=seed,
        plugin=True,
        hook=True,
        env={"NANSCOPE_TRACE_STEP": how["NANSCOPE_TRACE_STEP"]},
        load_rollouts=how["load_debug_rollout_data"],
    )
    launched = launcher.launch([spec], Layout(cp=1), timeout_s=timeout_s, out_dir=out, loss_flags=case.loss_flags())
    traces = [
        Path(path) for record in launched.runs[0].ranks for path in record.reports if path.endswith(".trace.json")
    ]
    if traces:
        first = json.loads(traces[0].read_text())["first"]
        check.replay = {
            "NANSCOPE_TRACE_STEP": how["NANSCOPE_TRACE_STEP"],
            "instruction": how["text"],
            "ranks_traced": len(traces),
            "wall_s": launched.wall_s,
            **first,
        }
    return check
