"""Numeric constants of fp32 and of the guard, torch-free (doctor and scan read them without torch).

FP32_MAX       the largest finite float32, 3.4028234663852886e38 (torch.finfo(torch.float32).max)
FP32_EXP_MAX   log(FP32_MAX) = 88.7228...: exp(x) overflows to +inf in fp32 for x above it
LOG_RATIO_BOUND  the guard clamps every log-ratio to [-20, 20] before exp
"""

from __future__ import annotations

import math

FP32_MAX = float.fromhex("0x1.fffffep+127")
FP32_EXP_MAX = math.log(FP32_MAX)

# The safe loss clamps every log-ratio to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before exp (as verl,
# NeMo-RL and OpenRLHF do). It never binds on healthy data: the PPO ratio saturates its clip at
# |log-ratio| ~ 0.25, low_var_kl saturates its [-10, 10] clamp at log-ratio ~ -2.6 or 11.0, and TIS
# saturates at log(tis_clip); exp(20) = 4.9e8 is far from the fp32 limit exp(88.72).
LOG_RATIO_BOUND = 20.0
