"""The plugin's before-train-step hook: an always-on sentinel, reports, skip mode, one traced step.

    --custom-megatron-before-train-step-hook-path nanscope.slime_plugin.before_train_step

The hook reads its settings once, when the plugin is first used in the process (the environment
variables are listed in `nanscope.slime_plugin.settings`; a bad value raises there, naming it).
What it does on the model is `nanscope.slime_plugin.watch`; the files it writes, `nanscope.slime_plugin.outputs`.
"""

from __future__ import annotations

from nanscope.slime_plugin import state
from nanscope.slime_plugin.outputs import replay_instruction
from nanscope.slime_plugin.settings import Settings
from nanscope.slime_plugin.watch import StepWatch

__all__ = ["Settings", "before_train_step", "logged", "replay_instruction", "reports", "skipped_steps", "uninstall"]


def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """slime's --custom-megatron-before-train-step-hook-path entry point.

    Installs an always-on sentinel on the model chunks (once: a new list of chunks or a new optimizer
    replaces the old installation): per-module output finiteness flags and a screen of the gradient
    buffers after each backward call, kept on device, read once per step with the step's vote, just before
    Megatron's DDP gradient check on every chunk (one per virtual pipeline stage). On a non-finite step it
    writes a report to NANSCOPE_REPORT_DIR, runs the step again for a verdict, then every rank raises with
    Megatron's words, or with NANSCOPE_ON_NONFINITE=skip every rank zeroes the step's gradients and skips
    its optimizer step (`watch`).
    """
    current = state.installation()
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if current.hook is None or not current.hook.installed_on(chunks, optimizer, opt_param_scheduler):
        current.remove()
        current.hook = StepWatch(chunks, optimizer, opt_param_scheduler, current.settings, current.target())
    current.hook.begin(args, rollout_id, step_id)


def uninstall() -> None:
    """Remove the hook from the model chunks and the optimizer (and scheduler), restoring them."""
    state.uninstall()


def _hook() -> StepWatch | None:
    current = state.current()
    return None if current is None else current.hook


def skipped_steps() -> int:
    """Steps the hook skipped in this process (NANSCOPE_ON_NONFINITE=skip)."""
    hook = _hook()
    return hook.skip.skipped if hook is not None else 0


def reports() -> list[str]:
    """Files the hook wrote in this process: reports (.json) with their bundles (.bundle.pt), traces (.trace.json)."""
    hook = _hook()
    return list(hook.files.paths) if hook is not None else []


def logged() -> list[dict]:
    """What the hook logged on this rank, one dict per step (the last 1,000): rollout_id, step_id, metrics,
    and `warnings`: the `nanscope: warning:` lines it printed for that step (without the prefix)."""
    hook = _hook()
    return list(hook.logger.logged) if hook is not None else []
