"""Which verl the plugin knows: the signatures it subclasses and calls, checked once at install, refused in one line.

The plugin overrides engine methods and calls verl's registries; a verl whose methods take other arguments would
fail mid-run, or worse, silently skip the plugin. So `check` compares the running verl's signatures with those of
verl v0.9.0 (the release the plugin is tested against) and raises one RuntimeError line naming the first that
differs, at install (inside init_model: verl imports `external_lib` there, verl/workers/config/model.py:148-149).

    EngineRegistry.register(model_type, backend, device, vendor)   verl/workers/engine/base.py:361-396
    EngineRegistry.get_engine_cls(model_type, backend)              base.py:398-427
    BaseEngine.train_batch(data, loss_function)                     base.py:113-132
    *.forward_backward_batch(data, loss_function, forward_only)     fsdp/transformer_impl.py:700, megatron :825
    *.optimizer_step(), lr_scheduler_step(), optimizer_zero_grad()  fsdp :753-812, megatron :670-711
    ppo_loss(config, model_output, data, dp_group)                  verl/workers/utils/losses.py:57
    a policy loss (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
                                                                    verl/trainer/ppo/core_algos.py:36-48, 1285-1294

verl 0.7.1 and older are refused with the reason (REFUSED_071): their EngineRegistry has no vendor key (the first
engine registered for a device wins, v0.7.1 verl/workers/engine/base.py:276-306), and their default workers run
`DataParallelPPOActor` (fsdp_workers.py, selected by use_legacy_worker_impl=auto, v0.7.1
verl/trainer/main_ppo.py:128-131), not an engine: the plugin could only enter there by patching verl.
"""

from __future__ import annotations

import inspect

KNOWN = "0.9.0"
REFUSED_071 = (
    "nanscope.verl_plugin: verl {version} is not supported: its EngineRegistry has no (device, vendor) key and its "
    "default actor is DataParallelPPOActor, not an engine, so nanscope could only enter by patching verl; use verl "
    ">= 0.9.0 (docs/verl.md)"
)
# (what, parameter names after self) of each method or function checked
ENGINE_METHODS = {
    "forward_backward_batch": ("data", "loss_function", "forward_only"),
    "optimizer_step": (),
    "lr_scheduler_step": (),
    "optimizer_zero_grad": (),
}
POLICY_LOSS = (
    "old_log_prob",
    "log_prob",
    "advantages",
    "response_mask",
    "loss_agg_mode",
    "config",
    "rollout_is_weights",
)


def check(*, version: str, registry, base_engine, engines: list, ppo_loss, vanilla) -> None:
    """Raise one RuntimeError line when the running verl differs from what the plugin knows.

    Args:
        version: verl.__version__.
        registry: verl's EngineRegistry; base_engine: BaseEngine; engines: the engine classes to be subclassed.
        ppo_loss: verl.workers.utils.losses.ppo_loss; vanilla: the registered "vanilla" policy loss.
    """
    if "vendor" not in _names(registry.register):
        raise RuntimeError(REFUSED_071.format(version=version))
    found = [
        ("EngineRegistry.register", _names(registry.register)[:4], ("model_type", "backend", "device", "vendor")),
        ("EngineRegistry.get_engine_cls", _names(registry.get_engine_cls), ("model_type", "backend")),
        ("BaseEngine.train_batch", _names(base_engine.train_batch), ("data", "loss_function")),
        ("ppo_loss", _names(ppo_loss), ("config", "model_output", "data", "dp_group")),
        ("the vanilla policy loss", _names(vanilla), POLICY_LOSS),
    ]
    for engine in engines:
        for method, names in ENGINE_METHODS.items():
            found.append((f"{engine.__name__}.{method}", _names(getattr(engine, method)), names))
    for what, have, want in found:
        if tuple(have) != tuple(want):
            raise RuntimeError(
                f"nanscope.verl_plugin: verl {version}'s {what} takes ({', '.join(have)}), not "
                f"({', '.join(want)}) as in verl {KNOWN}: this verl is not supported (docs/verl.md)"
            )
    if not isinstance(getattr(registry, "_engines", None), dict):
        raise RuntimeError(
            f"nanscope.verl_plugin: verl {version}'s EngineRegistry keeps no _engines dict: not supported"
        )


def _names(fn) -> tuple[str, ...]:
    """The parameter names of `fn`, without self/cls."""
    params = list(inspect.signature(fn).parameters)
    return tuple(p for p in params if p not in ("self", "cls"))
