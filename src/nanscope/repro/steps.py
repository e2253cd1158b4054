"""Several optimizer steps with the hazard injected at one of them (`run_steps`), with the plugin or without."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanscope import case
from nanscope.causes import catalogue
from nanscope.megatron import launcher, scratch
from nanscope.megatron.spec import Launcher, Layout, RunSpec
from nanscope.repro.plugin import PluginCheck, plugin_check
from nanscope.repro.runs import Repro, from_run, harness_notes, max_abs_diff


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
            check = plugin_check(as_is, skipped, inject_step=inject_step, max_skips=max_skips, report_dir=report_dir)
            check.steps, check.drifts, check.scratch_dir = steps, catalogue.get(hazard).drifts, str(out)
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
