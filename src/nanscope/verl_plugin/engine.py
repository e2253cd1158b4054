"""nanscope's engines: subclasses of verl's FSDP and Megatron engines, registered under the running (device, vendor).

verl builds the actor's and the critic's engine with `EngineRegistry.new(model_type, backend, ...)` (verl v0.9.0
verl/workers/engine_workers.py:135), which looks up `(device, vendor)` before `device` (verl/workers/engine/base.py:
409-416). `register` puts a subclass of whatever that lookup returns now (verl's FSDPEngineWithLMHead, or a
hardware vendor's subclass of it) under the exact `(device, vendor)` key: the subclass wins, and no verl function is
patched. A key a vendor registered already is overwritten in the registry's dict (`register` would assert,
base.py:387-389); the vendor's engine is the subclass's base, so nothing of it is lost.

The subclass (`NanscopeEngine` first in the MRO) overrides five methods and calls verl's own in each:

    initialize              after verl's: the watch on the model (`watch.Watch`; training engines only, not the
                            reference model's forward-only one)
    train_batch             the mini-batch cleaned and the loss observed (`Watch.begin`), verl's train_batch, then
                            the step's nanscope/* into its metrics as Metric(MAX) (verl/utils/metric/utils.py:61-66:
                            a MAX survives verl's aggregation over data parallelism and micro-batches,
                            engine_workers.py:207-208, 321-329), on the ranks verl collects outputs from
    forward_backward_batch  inside train_batch: a watched pass (`Watch.passes`: vote, report, rerun, verdict, raise
                            or skip); elsewhere (log-prob passes) verl's own
    optimizer_step          a skipped step: gradients zeroed, the update not taken, grad_norm NaN
    lr_scheduler_step       held when every optimizer step since the last schedule step was skipped
"""

from __future__ import annotations

import os

from verl.utils.metric import AggregationType, Metric

from nanscope.slime_plugin.outputs import warn
from nanscope.slime_plugin.settings import Settings
from nanscope.verl_plugin.watch import Watch

ROLES = {"language_model": "actor", "value_model": "critic"}


class NanscopeEngine:
    """The plugin's part of every engine subclass (see the module docstring); settings and role are class attributes
    the subclass sets (`subclass`)."""

    nanscope_settings: Settings | None = None
    nanscope_role: str = "actor"

    def initialize(self, *args, **kwargs):
        out = super().initialize(*args, **kwargs)
        config = getattr(self, "engine_config", None)
        self.nanscope_watch = None
        if not getattr(config, "forward_only", False):  # the reference model never trains
            try:
                self.nanscope_watch = Watch(self, settings=type(self).nanscope_settings, role=type(self).nanscope_role)
            except ValueError:  # the user's setting (a report directory no rank can write): one line, init_model ends
                raise
            except Exception as e:  # nanscope's own failure: a warning, and verl's engine as it is
                warn(f"could not watch the {type(self).nanscope_role}'s engine: {type(e).__name__}: {e}")
        return out

    def _watch(self) -> Watch | None:
        return getattr(self, "nanscope_watch", None)

    def train_batch(self, data, loss_function):
        watch = self._watch()
        if watch is None:
            return super().train_batch(data, loss_function)
        observed = watch.begin(data, loss_function)
        try:
            outputs = super().train_batch(data, observed)
        finally:
            watch.end()
        if self.is_mp_src_rank_with_outputs():
            metrics = outputs.setdefault("metrics", {})
            for name, value in watch.metrics.items():
                metrics[name] = Metric(AggregationType.MAX, value)
        return outputs

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        watch = self._watch()
        if forward_only or watch is None or not watch.training:
            return super().forward_backward_batch(data, loss_function, forward_only=forward_only)
        parent = super()
        return watch.passes(lambda: parent.forward_backward_batch(data, loss_function, forward_only=False))

    def optimizer_step(self):
        watch = self._watch()
        if watch is not None and watch.skips.take():
            self.optimizer_zero_grad()
            return float("nan")
        return super().optimizer_step()

    def lr_scheduler_step(self):
        watch = self._watch()
        if watch is None or watch.lr_step():
            return super().lr_scheduler_step()
        return _current_lr(self)


def _current_lr(engine) -> float:
    """The learning rate the schedule holds (a held step returns it, as verl's step would return the new one)."""
    scheduler = getattr(engine, "lr_scheduler", None)
    if hasattr(scheduler, "get_last_lr"):
        return scheduler.get_last_lr()[0]
    return engine.optimizer.param_groups[0]["lr"]


def subclass(base: type, *, settings: Settings, model_type: str) -> type:
    """`base` with `NanscopeEngine` in front, its settings and role bound."""
    attrs = {"nanscope_settings": settings, "nanscope_role": ROLES[model_type], "__module__": __name__}
    return type(f"Nanscope{base.__name__}", (NanscopeEngine, base), attrs)


def register(registry, *, settings: Settings, device: str, vendor: str | None, backends: tuple[str, ...]) -> list:
    """Register nanscope's subclass of the engine verl would pick now, per model type and backend, under
    (device, vendor); returns [(model_type, backend, class)] registered. A backend with no engine for this device
    is left alone."""
    done = []
    key = (os.getenv("VERL_ENGINE_DEVICE") or device, os.getenv("VERL_ENGINE_VENDOR") or vendor)
    for model_type in ROLES:
        for backend in backends:
            try:
                base = registry.get_engine_cls(model_type, backend)
            except (AssertionError, ValueError):  # no such backend or none for this device: nothing to wrap
                continue
            if issubclass(base, NanscopeEngine):
                continue  # installed already
            cls = subclass(base, settings=settings, model_type=model_type)
            table = registry._engines[model_type][backend]
            if key in table:  # a vendor's own registration: `register` would assert; ours wraps theirs
                table[key] = cls
            else:
                registry.register(model_type=model_type, backend=backend, device=key[0], vendor=key[1])(cls)
            done.append((model_type, backend, cls))
    if not done:
        warn(f"verl has no FSDP or Megatron engine for device {key[0]!r} here: nanscope watches no engine")
    return done
