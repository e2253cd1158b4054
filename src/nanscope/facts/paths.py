"""The dotted paths a slime launch script names nanscope's plugin by (doctor's fix texts and rules cite them), and
the names of the plugin's report directory and of the files it writes there.

tests/slime_plugin check that each resolves to the object it names.
"""

from __future__ import annotations

import re

PLUGIN = "nanscope.slime_plugin"
# The plugin's NANSCOPE_REPORT_DIR default, and `repro --plugin`'s --report-dir default: one spelling. The old
# spelling of `repro --plugin`'s (nanscope-reports) is still read where a report directory is read.
REPORT_DIR = "nanscope_reports"
OLD_REPORT_DIRS = ("nanscope-reports",)
LOSS_FUNCTION_PATH = f"{PLUGIN}.policy_loss"  # --custom-loss-function-path
HOOK_PATH = f"{PLUGIN}.before_train_step"  # --custom-megatron-before-train-step-hook-path

# The plugin's files in NANSCOPE_REPORT_DIR (nanscope.slime_plugin.outputs): a report, its repro bundle, a trace,
# and the .pt micro-batch file of plugins before the bundle (which `nanscope trace` refuses with what to do)
BUNDLE_SUFFIX = ".bundle.pt"
REPORT_FILE = re.compile(r"rollout\d+_step\d+_rank\d+(\.json|\.trace\.json|\.bundle\.pt|\.pt)")
