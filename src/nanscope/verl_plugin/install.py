"""Installing the plugin into the running verl, once per process, when `nanscope.verl_plugin` is imported.

verl imports the module named by `actor_rollout_ref.model.external_lib` in every worker during `init_model`,
before it builds the engine (verl v0.9.0 verl/workers/config/model.py:113,148-149, reached from
verl/workers/engine_workers.py:534, the engine built at :638 through EngineRegistry.new, :135), and the modules of
`VERL_USE_EXTERNAL_MODULES` inside `import verl` (verl/__init__.py:38-41). Either way an exception here ends
`init_model` with its one line. `install`:

    1. reads the NANSCOPE_* settings once (slime_plugin.settings.Settings: a bad value is one ValueError line)
    2. checks the running verl's signatures (`signatures.check`: another verl is refused in one line)
    3. registers the `nanscope` policy loss mode (verl's register_policy_loss, core_algos.py:53-67) wrapping
       NANSCOPE_INNER_LOSS_MODE, which must name a registered mode other than nanscope
    4. registers the engine subclasses under the running (device, vendor) (`engine.register`)

Nothing is patched; a second import (or `install` again) finds its loss mode registered and does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.slime_plugin.settings import Settings
from nanscope.verl_plugin import signatures
from nanscope.verl_plugin.loss import NAME, GuardedLoss

BACKENDS = ("fsdp", "fsdp2", "megatron")


@dataclass(frozen=True)
class Installed:
    """What `install` registered: the settings, the loss mode, the engine classes [(model_type, backend, class)]."""

    settings: Settings
    loss: GuardedLoss
    engines: tuple


def install(settings: Settings | None = None) -> Installed | None:
    """Install into the running verl (see the module docstring); None if this process has it already."""
    import verl  # heavy: the training framework this module plugs into
    from verl.trainer.ppo import core_algos  # heavy: verl
    from verl.workers.engine.base import BaseEngine, EngineRegistry  # heavy: verl
    from verl.workers.utils.losses import ppo_loss  # heavy: verl

    current = core_algos.POLICY_LOSS_REGISTRY.get(NAME)
    if isinstance(current, GuardedLoss):
        return None
    settings = settings or Settings.from_env(verl=True)
    engines = _engine_classes()
    signatures.check(
        version=verl.__version__, registry=EngineRegistry, base_engine=BaseEngine, engines=engines,
        ppo_loss=ppo_loss, vanilla=core_algos.get_policy_loss_fn("vanilla"),
    )  # fmt: skip
    modes = sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k != NAME)
    if settings.inner_loss_mode not in modes:
        raise ValueError(
            f"NANSCOPE_INNER_LOSS_MODE={settings.inner_loss_mode!r}: expected one of verl's policy loss modes: "
            f"{', '.join(modes)}"
        )
    loss = GuardedLoss(inner=settings.inner_loss_mode, lookup=core_algos.get_policy_loss_fn)
    core_algos.register_policy_loss(NAME)(loss)
    from verl.utils.device import get_device_name, get_vendor  # heavy: verl (get_vendor: 0.9.0 on, checked above)

    from nanscope.verl_plugin import engine  # heavy: imports verl's metric module

    done = engine.register(
        EngineRegistry, settings=settings, device=get_device_name(), vendor=get_vendor(), backends=BACKENDS
    )
    return Installed(settings=settings, loss=loss, engines=tuple(done))


def _engine_classes() -> list:
    """verl's FSDP engine and, where megatron-core imports, its Megatron engine: the classes subclassed."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine  # heavy: verl

    found = [FSDPEngine]
    try:
        from verl.workers.engine.megatron.transformer_impl import MegatronEngine  # optional: megatron-core
    except ImportError:
        return found
    return found + [MegatronEngine]
