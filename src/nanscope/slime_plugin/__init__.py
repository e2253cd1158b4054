"""nanscope inside a real slime run (v0.1.0, v0.2.4, v0.3.1, main): the NaN-safe loss and a before-train-step hook.

Add to the launch script (every supported release has these flags):

    --loss-type custom_loss
    --custom-loss-function-path nanscope.slime_plugin.policy_loss
    --custom-megatron-before-train-step-hook-path nanscope.slime_plugin.before_train_step

Environment variables (read once, into `settings.Settings`):
    NANSCOPE_NAN_POLICY   drop (default) | strict: what the loss does with a non-finite log-prob or
                          advantage (drop the token/sample and count it, or raise naming it)
    NANSCOPE_REPORT_DIR   where the sentinel writes its report and the micro-batch to replay
                          (default ./nanscope_reports)
    NANSCOPE_ON_NONFINITE raise (default: Megatron's check kills the step, as without nanscope)
                          | skip (zero the gradients, skip the optimizer step, grad norm NaN, log
                          nanscope/skipped_steps)
    NANSCOPE_MAX_SKIPS    K: with skip, end the run with an error after K skipped steps in a row
    NANSCOPE_TRACE_STEP   R:S: trace rollout R's step S op by op (rerun with --load-debug-rollout-data)

`configure(Settings(...))` gives the settings as an object instead (the CPU harness does); `uninstall()`
removes the hook and restores the model chunks and the optimizer.

    loss.py      the custom loss: the running release's policy loss inside nanscope.loss.guard
    hook.py      the before-train-step entry point and what it reports back
    watch.py     the hook on the model chunks (sentinel, wrappers, per-step state)
    settings.py, state.py, coords.py, outputs.py, skip.py   its settings, the one registry, this rank's
                 coordinates, the files it writes, skip mode's vote
"""

from __future__ import annotations

from nanscope.slime_plugin.hook import before_train_step, logged, reports, skipped_steps, uninstall
from nanscope.slime_plugin.loss import policy_loss
from nanscope.slime_plugin.settings import Settings
from nanscope.slime_plugin.state import configure

__all__ = [
    "Settings",
    "before_train_step",
    "configure",
    "logged",
    "policy_loss",
    "reports",
    "skipped_steps",
    "uninstall",
]
