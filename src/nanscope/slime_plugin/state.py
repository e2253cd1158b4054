"""The plugin's state in one process: one `Installation`, held by the one module-level registry.

slime calls the plugin's loss and hook as plain functions by their dotted paths, so their shared state
cannot be passed to them: it lives in the installation the registry holds, and nowhere else.

    Installation   the settings (read once from the environment, or given by `configure`), the loss
                   module the guard wraps (identified once), and the hook on the model chunks, if any

The loss is never told when a step ends. So it hands each micro-batch to the installed hook, which keeps
them for the current step only (it starts afresh at every `before_train_step`); without a hook nothing is
kept, so a run that installs the loss alone holds no micro-batch beyond the call.
"""

from __future__ import annotations

import contextlib
import sys

from nanscope.loss import target as targets
from nanscope.slime_plugin.settings import Settings
from nanscope.slime_plugin.watch import StepWatch


class Installation:
    """What the plugin holds in this process (see the module docstring)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.hook: StepWatch | None = None
        self._target: targets.Target | None = None

    def target(self) -> targets.Target:
        """The loss module this process runs, identified on first use and again only if another is loaded."""
        t = self._target
        if t is None or sys.modules.get(t.release.module) is not t.module:
            t = self._target = targets.running()
        return t

    def observing(self, args, batch: dict):
        """The plugin's loss call on `batch`: the hook's record of it for this step (nothing without a hook)."""
        return contextlib.nullcontext() if self.hook is None else self.hook.losses.observing(args, batch)

    def remove(self) -> None:
        if self.hook is not None:
            self.hook.remove()
            self.hook = None


class _Registry:
    """The one module-level registry (the module docstring says why there is one)."""

    def __init__(self):
        self.current: Installation | None = None


_REGISTRY = _Registry()


def installation() -> Installation:
    """This process's installation; the first call reads the settings from the environment."""
    if _REGISTRY.current is None:
        _REGISTRY.current = Installation(Settings.from_env())
    return _REGISTRY.current


def current() -> Installation | None:
    """This process's installation, None before the plugin's first use (or after `uninstall`)."""
    return _REGISTRY.current


def configure(settings: Settings) -> Installation:
    """Start a fresh installation with these settings instead of the environment's (the CPU harness does)."""
    uninstall()
    _REGISTRY.current = Installation(settings)
    return _REGISTRY.current


def uninstall() -> None:
    """Remove the hook from the model chunks and the optimizer (and scheduler), restoring them; forget the rest."""
    if _REGISTRY.current is not None:
        _REGISTRY.current.remove()
        _REGISTRY.current = None
