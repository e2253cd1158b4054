"""The dotted paths a slime launch script names nanscope's plugin by (doctor's fix texts and rules cite them).

tests/slime_plugin check that each resolves to the object it names.
"""

from __future__ import annotations

PLUGIN = "nanscope.slime_plugin"
LOSS_FUNCTION_PATH = f"{PLUGIN}.policy_loss"  # --custom-loss-function-path
HOOK_PATH = f"{PLUGIN}.before_train_step"  # --custom-megatron-before-train-step-hook-path
