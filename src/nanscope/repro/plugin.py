"""`repro --plugin`: the plugin's reports read, its bundles replayed offline as `nanscope trace` does, and left in
a report directory as the plugin writes its own files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from nanscope.outputs import copy_file
from nanscope.repro.runs import Repro

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
    left_out: list[str] = field(default_factory=list)  # files that could not be left there, with why (one line each)
    steps: int = 0  # the run's optimizer steps
    drifts: bool = False  # a drifting hazard: every step from inject_step on crosses, and the warning comes first
    scratch_dir: str | None = None  # the harness's temporary directory, removed when the run ended (its rollouts)

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


def plugin_check(
    raised: Repro, skipped: Repro, *, inject_step: int, max_skips: int | None, report_dir: str | Path | None
) -> PluginCheck:
    """Read the raise run's reports and replay its bundles offline, as `nanscope trace REPORT_DIR` does (no second
    harness run); with `report_dir`, leave the reports and bundles there."""
    written = [Path(path) for record in raised.ranks for path in record.reports]
    files = [path for path in written if path.name.endswith(".json") and not path.name.endswith(".trace.json")]
    reports = [json.loads(file.read_text()) for file in files]
    check = PluginCheck(
        inject_step=inject_step, raised=raised, skipped=skipped, max_skips=max_skips, reports=reports, replay=None
    )
    if report_dir is not None and written:
        check.report_dir = str(report_dir)
        check.left_out = [why for path in written if (why := _leave(path, Path(report_dir)))]
    bundles = sorted(path for path in written if path.name.endswith(".bundle.pt"))
    if reports and bundles:
        check.replay = offline_replay(bundles, reports[0]["replay"])
    return check


def _leave(path: Path, report_dir: Path) -> str | None:
    """Copy the run's file `path` into `report_dir` as the plugin writes its files (`nanscope.outputs`: a link at the
    name is replaced, never followed). Why it could not be left there (one line), else None: the run's result never
    depends on it."""
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        copy_file(path, report_dir / path.name)
    except OSError as e:
        return f"{report_dir / path.name}: {e.strerror or e}"
    return None


def offline_replay(bundles: list[Path], how: dict) -> dict:
    """The step's bundles replayed as `nanscope trace` replays them (`trace.bundles.bundle_step`), with the report's
    replay instruction."""
    from nanscope.trace.bundles import bundle_step  # heavy: torch

    replayed = bundle_step.replay_step(bundles)
    return {
        "NANSCOPE_TRACE_STEP": how["NANSCOPE_TRACE_STEP"],
        "instruction": how["text"],
        **replayed,
        "source": "offline: nanscope trace on the raise run's bundles",
    }
