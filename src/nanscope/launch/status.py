"""The three statuses a catalogued cause takes in doctor's differential (`launch.candidates`, `launch.moe`)."""

from __future__ import annotations

ENABLED, UNDECIDABLE, RULED_OUT = "enabled", "undecidable", "ruled-out"
STATUSES = (ENABLED, UNDECIDABLE, RULED_OUT)
