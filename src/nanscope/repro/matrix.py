"""The matrix: each hazard under as-is and safe, in one launch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nanscope import case
from nanscope.causes import catalogue
from nanscope.megatron import launcher, scratch
from nanscope.megatron.spec import Launcher, Layout, RunSpec
from nanscope.repro.runs import Repro, from_run, harness_notes


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


def run_matrix(
    *,
    seed: int = 0,
    timeout_s: float = 600.0,
    via: Launcher = Launcher(),
    hazards=catalogue.CATALOGUE,
    progress: Callable[[str], None] | None = None,
) -> Matrix:
    """`hazards` (default: every catalogue hazard) under as-is and safe, in one launch (one process group for all
    runs); `progress(line)` after each run ("run 3 of 10 done: kl-exp-overflow, as-is")."""
    layout = Layout()
    specs = []
    for hazard in hazards:  # on the healthy batch each rank compares safe's grads with as-is's
        healthy = hazard.name == "healthy"
        specs += [
            RunSpec(hazard=hazard.name, loss="as-is", seed=seed, save_grads=healthy),
            RunSpec(hazard=hazard.name, loss="safe", seed=seed, compare_grads=len(specs) if healthy else None),
        ]
    with scratch.directory("nanscope-matrix-") as out:  # swept by the next launch if this process is killed
        launched = launcher.launch(
            specs,
            layout,
            timeout_s=timeout_s,
            out_dir=out,
            loss_flags=case.loss_flags(),
            via=via,
            progress=_runs_done(specs, progress),
        )
        reps = [from_run(run, launched, layout) for run in launched.runs]
        rows = []
        for hazard, (as_is, safe) in zip(hazards, zip(reps[::2], reps[1::2])):
            diffs = [record.grad_diff for record in safe.ranks]
            diff = max(diffs) if hazard.name == "healthy" and diffs and None not in diffs else None
            rows.append(MatrixRow(hazard.name, hazard.mechanism, as_is, safe, diff))
    return Matrix(rows, launched.wall_s, rows[0].as_is.layout, harness_notes(layout))


def _runs_done(specs: list[RunSpec], progress: Callable[[str], None] | None):
    """The launch's callback for `progress`: one line a finished run, naming its hazard and loss."""
    if progress is None:
        return None

    def done(run: int, step: int | None, steps: int | None) -> None:
        if step is None and 0 <= run < len(specs):
            progress(f"run {run + 1} of {len(specs)} done: {specs[run].hazard}, {specs[run].loss}")

    return done
