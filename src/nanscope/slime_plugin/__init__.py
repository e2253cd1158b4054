"""nanscope inside a real slime run (v0.1.0, v0.2.4, v0.3.1, main): the NaN-safe loss and a before-train-step hook.

Add to the launch script (every supported release has these flags):

    --loss-type custom_loss
    --custom-loss-function-path nanscope.slime_plugin.policy_loss
    --custom-megatron-before-train-step-hook-path nanscope.slime_plugin.before_train_step

Environment variables (read once, into `settings.Settings`; a bad value, or settings that contradict each other,
is one ValueError line at install; a NANSCOPE_* name that is none of these is a warning naming the closest):
    NANSCOPE_NAN_POLICY   drop (default) | strict: what the loss does with a non-finite log-prob or
                          advantage (drop the token/sample and count it, or raise naming it)
    NANSCOPE_REPORT_DIR   where the sentinel writes its report and the micro-batch to replay
                          (default ./nanscope_reports; a system directory is refused)
    NANSCOPE_ON_NONFINITE raise (default: Megatron's check kills the step, as without nanscope, on every rank
                          with Megatron's words) | skip (zero the gradients, skip the optimizer step, grad norm
                          NaN, log nanscope/skipped_steps)
    NANSCOPE_MAX_SKIPS    K: with skip, end the run with an error after K skipped steps in a row
    NANSCOPE_RERUN        on (default) | off: run a non-finite step again once and give a verdict
    NANSCOPE_SKIP_ON      any (default) | transient: with skip, skip only steps the rerun found transient with
                          nothing else left open (needs NANSCOPE_RERUN=on)
    NANSCOPE_MAX_BUNDLES  N: repro bundles a rank writes in a run (default 8)
    NANSCOPE_TRACE_STEP   R:S: trace rollout R's step S op by op (rerun with --load-debug-rollout-data)
    NANSCOPE_WARN_GAP, NANSCOPE_WARN_LOG_RATIO   the early-warning thresholds (`settings`)

`configure(Settings(...))` gives the settings as an object instead (the CPU harness does); `uninstall()`
removes the hook and restores the model chunks and the optimizer.

    loss.py      the custom loss: the running release's policy loss inside nanscope.loss.guard
    hook.py      the before-train-step entry point and what it reports back
    watch.py     the hook on the model chunks and the step it watches, as a state machine over the modules:
                 gate.py (every chunk's finish_grad_sync), step_vote.py (the vote), nonfinite.py (what each rank
                 saw), report.py (the report and bundle), rerun.py (the second pass), verdict.py, ending.py
                 (raise, skip or go on)
    settings.py, state.py, coords.py, outputs.py, skip.py, names.py   its settings, the one registry, this rank's
                 coordinates, the files it writes, skip mode's counters, public names over several chunks

docs/layouts.md lists the layouts it is tested at; docs/costs.md what it costs a healthy step.
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
