"""The dotted paths a launch script names the plugin by resolve to the plugin's entry points."""

import importlib

from nanscope import slime_plugin
from nanscope.facts import paths


def resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_each_path_names_the_entry_point():
    assert resolve(paths.LOSS_FUNCTION_PATH) is slime_plugin.policy_loss
    assert resolve(paths.HOOK_PATH) is slime_plugin.before_train_step
