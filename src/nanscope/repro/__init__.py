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

from nanscope.repro.matrix import Matrix, MatrixRow, run_matrix
from nanscope.repro.plugin import WARN_LEAD, PluginCheck, offline_replay
from nanscope.repro.runs import (
    Repro,
    expected_outcome,
    from_run,
    harness_notes,
    max_abs_diff,
    repro_one,
    sentinel_finding,
)
from nanscope.repro.steps import StepsCheck, run_steps

__all__ = [
    "WARN_LEAD", "Matrix", "MatrixRow", "PluginCheck", "Repro", "StepsCheck", "expected_outcome", "from_run",
    "harness_notes", "max_abs_diff", "offline_replay", "repro_one", "run_matrix", "run_steps", "sentinel_finding",
]  # fmt: skip
