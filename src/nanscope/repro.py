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

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from nanscope import case


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
        return all(r.params_finite for r in self.ranks) if self.ranks else False

    @property
    def grad_norm(self) -> float | None:
        """The optimizer's (global) grad norm of the last completed step."""
        norms = [r.optimizer_grad_norm[-1] for r in self.ranks if r.optimizer_grad_norm]
        return norms[0] if norms else None


def expected_outcome(hazard: str, loss: str, fault: str | None = None) -> str:
    """The as-is loss fails the NaN check exactly when the catalogue says its gradient is not finite; the safe
    loss where its fix lives elsewhere (a flag, the model); both where a fault is planted in the model."""
    from nanscope.causes import catalogue

    h = catalogue.get(hazard)
    broken = not h.grad_finite if loss == "as-is" else not h.safe_finite
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
    seen = [r for r in ranks if r.sentinel and r.sentinel["candidates"]]
    keys = ("step", "module", "direction", "microbatch", "class", "candidates", "evidence")
    if not seen:
        evidence = ranks[0].sentinel["evidence"] if ranks and ranks[0].sentinel else ["the sentinel did not run"]
        return {"rank": None, **dict.fromkeys(keys), "candidates": [], "evidence": evidence}
    first = min(seen, key=lambda r: (0, r.pp, r.rank) if r.sentinel["forward"] else (1, -r.pp, *_when(r), r.rank))
    return {"rank": first.rank, **{k: first.sentinel[k] for k in keys}}


def _when(r) -> tuple[int, int]:
    """(micro-batch, output-gradient check index) of a rank's first non-finite gradient; unknown last."""
    made = r.sentinel.get("producer")
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
    from nanscope import case
    from nanscope.megatron.spec import failed_check

    spec = run.spec
    observed = "timeout" if launched.timed_out and run.observed == "incomplete" else run.observed
    failing = [r for r in run.ranks if failed_check(r)]
    first = run.first_failure()
    notes = [f"rank {r}: no record ({launched.stuck.get(r, 'crashed or killed')})" for r in run.missing]
    if observed in ("incomplete", "timeout", "error"):
        notes.append("torchrun output (tail):\n" + launched.stderr_tail[-3000:])
    head = run.ranks[0] if run.ranks else None
    finding = sentinel_finding(run.ranks)
    # the rank where the non-finite value began: its tracer saw the producing op
    traced = next((r for r in run.ranks if r.rank == finding["rank"]), None) or first or (run.ranks or [None])[-1]
    sites = [s for s in (head.hazard_sites if head else []) if s is not None]
    lps = [s for s in (head.site_log_probs if head else []) if s is not None]
    return Repro(
        hazard=spec.hazard,
        loss=spec.loss,
        expected=expected or expected_outcome(spec.hazard, spec.loss, spec.model_fault),
        observed=observed,
        layout={"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "cp_loss_level": layout.cp},
        ranks=run.ranks,
        first_failure=first.rank if first else None,
        frames_match_case=all(tuple(r.frames) == case.frames() for r in failing) if failing else None,
        wall_s=launched.wall_s,
        notes=notes,
        site=sites[0] if sites else None,
        site_log_probs=lps[0] if lps else None,
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
    from nanscope.megatron import launcher
    from nanscope.megatron.spec import Layout, RunSpec

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
    import torch

    worst = 0.0
    for pa, pb in zip(paths_a, paths_b):
        if not pa or not pb or not Path(pa).exists() or not Path(pb).exists():
            return None
        a, b = torch.load(pa, weights_only=True), torch.load(pb, weights_only=True)
        assert a.keys() == b.keys()
        for k in a:
            worst = max(worst, float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0)
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
    from nanscope.causes import catalogue
    from nanscope.megatron import launcher
    from nanscope.megatron.spec import Layout, RunSpec

    layout = Layout()
    specs = []
    for h in catalogue.CATALOGUE:  # on the healthy batch each rank compares safe's grads with as-is's, entry by entry
        healthy = h.name == "healthy"
        specs += [
            RunSpec(hazard=h.name, loss="as-is", seed=seed, save_grads=healthy),
            RunSpec(hazard=h.name, loss="safe", seed=seed, compare_grads=len(specs) if healthy else None),
        ]
    with tempfile.TemporaryDirectory(prefix="nanscope-matrix-") as out:
        launched = launcher.launch(specs, layout, timeout_s=timeout_s, out_dir=out, loss_flags=case.loss_flags())
        reps = [from_run(run, launched, layout) for run in launched.runs]
        rows = []
        for h, (as_is, safe) in zip(catalogue.CATALOGUE, zip(reps[::2], reps[1::2])):
            diffs = [r.grad_diff for r in safe.ranks]
            diff = max(diffs) if h.name == "healthy" and diffs and None not in diffs else None
            rows.append(MatrixRow(h.name, h.mechanism, as_is, safe, diff))
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
        steps = {(r["rollout_id"], r["step_id"], r["replay"]["NANSCOPE_TRACE_STEP"]) for r in self.reports}
        found = self.replay is not None and any(self.replay[k] for k in ("forward", "backward", "first_forward"))
        k = self.inject_step - 1
        norms = [r.optimizer_grad_norm for r in self.skipped.ranks]
        skipped = all(r.skipped_steps == 1 for r in self.skipped.ranks)
        skipped &= all(len(n) == k or n[k] != n[k] for n in norms)  # NaN at the skipped step (or stopped there)
        return (
            len(self.reports) == len(self.raised.ranks)
            and steps == {(k, 0, f"{k}:0")}
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
        steps = {r.error_step for r in self.as_is.ranks if not r.ok}
        return min(steps) if steps else None

    @property
    def safe_steps(self) -> int:
        return min((len(r.optimizer_grad_norm) for r in self.safe.ranks), default=0)

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
    from nanscope.causes import catalogue
    from nanscope.megatron import launcher
    from nanscope.megatron.spec import Layout, RunSpec

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
            diff = max_abs_diff([r.params_path for r in safe.ranks], [r.params_path for r in twin_rep.ranks])
        check = None
        if plugin:
            skipped = from_run(launched.runs[-1], launched, layout, expected="completed")
            check = _plugin_check(as_is, skipped, seed, inject_step, max_skips, Path(out) / "replay", timeout_s)
    notes = harness_notes(layout) + (
        [
            "plugin: harness step k is rollout k-1 (one optimizer step per rollout); "
            "the replay rebuilds each step's batch from its seed, as the saved rollout "
            "holds it"
        ]
        if plugin
        else []
    )
    return StepsCheck(hazard, steps, inject_step, as_is, safe, twin_rep, diff, launched.wall_s, notes, check)


def _plugin_check(
    raised: Repro, skipped: Repro, seed: int, inject_step: int, max_skips, out: Path, timeout_s: float
) -> PluginCheck:
    """Read the raise run's reports and run the replay each one prints: NANSCOPE_TRACE_STEP with the
    saved rollouts as --load-debug-rollout-data."""
    import json

    from nanscope.megatron import launcher
    from nanscope.megatron.spec import Layout, RunSpec

    files = [Path(p) for r in raised.ranks for p in r.reports if not p.endswith(".trace.json")]
    reports = [json.loads(p.read_text()) for p in files]
    check = PluginCheck(inject_step, raised, skipped, max_skips, reports, None)
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
    traces = [Path(p) for r in launched.runs[0].ranks for p in r.reports if p.endswith(".trace.json")]
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
