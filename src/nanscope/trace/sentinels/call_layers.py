"""A wrapper installed as a layer of one module's call, and taken off again: how the sentinel checks outputs.

A module's layers, in its instance state (`CHECKS`): its class's `_call_impl`, then one wrapper per
sentinel, in install order, each bound to the module (deepcopy binds a copy's layers to the copy); the
module's `_call_impl`, which `__call__` looks up on the instance, is the last. A wrapper calls the layer
below it (`below`), then checks the output in the same frame. Not a forward hook: a module with any hook
takes nn.Module's slow call path (hook dictionaries, backward-hook set-up, ~12k instructions more per call).
"""

from __future__ import annotations

import types

import torch

CHECKS = "_nanscope_checks"  # a checked module's instance attribute: the layers of its call (CheckHandle)


def below(layers: list, wrapper):
    """The call that `wrapper` wraps: the layer installed before it (the first layer is the class's call)."""
    for i, layer in enumerate(layers):
        if layer.__func__ is wrapper:
            return layers[i - 1]
    raise AssertionError("wrapper not installed")


class CheckHandle:
    """An output check installed as a layer of a module's call; `remove()` takes it off."""

    def __init__(self, module: torch.nn.Module, wrapper):
        self.module, self.wrapper = module, wrapper
        state = module.__dict__
        layers = state.setdefault(CHECKS, [types.MethodType(type(module)._call_impl, module)])
        layers.append(types.MethodType(wrapper, module))
        state["_call_impl"] = layers[-1]

    def remove(self) -> None:
        state = self.module.__dict__
        layers = [layer for layer in state.get(CHECKS, []) if layer.__func__ is not self.wrapper]
        if len(layers) > 1:
            state[CHECKS], state["_call_impl"] = layers, layers[-1]
        else:
            state.pop(CHECKS, None)
            state.pop("_call_impl", None)
