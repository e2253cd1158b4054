"""A dynamic loss scaler's initial scale, where the run prints its own configuration: the scale its first
overflowing step attempts when that step comes at the run's start (launch.scales: a series starting there is the scaler
calibrating, whatever the scale).

    [INFO] [config.py:752:print]   dynamic_loss_scale_args ...... {'init_scale': 256, 'scale_window': 1000, ...}
    [INFO] [config.py:1005:print]   initial_dynamic_scale ........ 256
            "initial_scale_power": 8,                                   DeepSpeed's json of its config: 2^8
      initial_loss_scale .............................. 4294967296.0      Megatron-LM's arguments

DeepSpeed prints its config at start, `  {name} {dots} {value}` for each attribute (DeepSpeed 0.16.4
deepspeed/runtime/config.py:1000-1005, DeepSpeedConfig.print), then the user's json (print_user_config, :990-997); its
dynamic_loss_scale_args hold init_scale = 2**initial_scale_power (:215-236), initial_dynamic_scale the same (:203-212,
:840), and the optimizers' DynamicLossScaler starts there (fp16/loss_scaler.py:119, :127; CreateLossScaler :208-212).
Megatron-LM prints its arguments the same way (core_v0.15.0rc0 megatron/training/arguments.py:1117-1125), its scaler
starting at --initial-loss-scale (:2285; megatron/core/optimizer/__init__.py:422).

    initial(text)   # (256.0, "dynamic_loss_scale_args' init_scale 256"); None: no such line
"""

from __future__ import annotations

import math
import re

_NUMBER = r"(?P<scale>\d[\d.eE+]{0,30})"
# (pattern, its name as said); each anchored on a literal, bounded repeats only: linear in the line
_PRINTS = (
    (re.compile(r"\bdynamic_loss_scale_args \.{1,60} \{[^}\n]{0,400}?'init_scale': " + _NUMBER),
     "dynamic_loss_scale_args' init_scale"),
    (re.compile(r"\binitial_dynamic_scale \.{1,60} " + _NUMBER), "initial_dynamic_scale"),
    (re.compile(r"\binitial_loss_scale \.{1,60} " + _NUMBER), "initial_loss_scale"),
)  # fmt: skip
_POWER = re.compile(r"\"initial_scale_power\":\s{0,4}(?P<power>\d{1,2})\b")
ANCHORS = (b"initial_scale_power", b"initial_dynamic_scale")  # the lines' literals no other needle finds


def initial(text: str) -> tuple[float, str] | None:
    """The initial loss scale a config line prints, and how it is said (None: the line prints none)."""
    if "init" not in text:
        return None
    for pattern, name in _PRINTS:
        match = pattern.search(text)
        if match is not None and (scale := _float(match["scale"])) is not None:
            return scale, f"{name} {match['scale'].rstrip('.,')}"
    power = _POWER.search(text)
    if power is not None:
        return 2.0 ** int(power["power"]), f"initial_scale_power {power['power']}, 2^{power['power']}"
    return None


def _float(text: str) -> float | None:
    try:
        value = float(text.rstrip(".,"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None
