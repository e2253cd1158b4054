"""The dotted paths a slime launch script names nanscope's plugin by (doctor's fix texts and rules cite them), and
the names of the files the plugin writes into its report directory.

tests/slime_plugin check that each resolves to the object it names.
"""

from __future__ import annotations

import re

PLUGIN = "nanscope.slime_plugin"
LOSS_FUNCTION_PATH = f"{PLUGIN}.policy_loss"  # --custom-loss-function-path
HOOK_PATH = f"{PLUGIN}.before_train_step"  # --custom-megatron-before-train-step-hook-path

# The plugin's files in NANSCOPE_REPORT_DIR (nanscope.slime_plugin.outputs): a report, its repro bundle, a trace,
# and the .pt micro-batch file of plugins before the bundle (which `nanscope trace` refuses with what to do)
BUNDLE_SUFFIX = ".bundle.pt"
REPORT_FILE = re.compile(r"rollout\d+_step\d+_rank\d+(\.json|\.trace\.json|\.bundle\.pt|\.pt)")
