"""Known evidence lines cut at their end (an excerpt's last line, a log viewer's width): `[Rank 5] Watchdog caught
collective operati`, `OVERFLOW! Rank 0 Sk`. A line that ends inside a known wording, past a prefix that names it, is
that evidence, said to be cut (read by launch.signals after its whole-line readers).

    signal, fields = cut(line) or (None, None)
"""

from __future__ import annotations

import re

from nanscope.facts.signals import BY_ID, Signal
from nanscope.launch.scaler_lines import logging_rank

# each wording (`0` for any number), the length of its shortest prefix that names it, and the signal it is
_CUTS = (
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=0, OpType=", 15, "nccl-timeout"),
    ("Some NCCL operations have failed or timed out", 14, "nccl-timeout"),
    ("OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 0, reducing to 0", 14, "deepspeed-overflow"),
    ("Current loss scale already at minimum - cannot decrease scale anymore", 26, "loss-scale-minimum"),
    ("probability tensor contains either `inf`, `nan` or element < 0", 20, "probability-assert"),
    ("Skipped 0 iterations in a row due to Overflow", 22, "overflow-exit"),
)  # fmt: skip
_DIGITS = re.compile(r"\d{1,40}(?:\.\d{1,40})?")
_WAITING = re.compile(r"\[Rank (?P<rank>\d{1,9})\]\s?\Z")


def cut(line: str) -> tuple[Signal, dict] | None:
    """A known evidence line cut before its end: the signal its prefix names (`_CUTS`), said to be cut."""
    tail = line.rstrip()[-400:]
    for wording, shortest, signal in _CUTS:
        at = tail.find(wording[:shortest])
        if at < 0:
            continue
        rest = _DIGITS.sub("0", tail[at:])
        if len(rest) >= len(wording) or not wording.startswith(rest):
            continue
        fields = {"detail": f"cut at its end: {tail[at:][:120]}"}
        waiting = _WAITING.search(tail, 0, at)
        if signal == "nccl-timeout" and waiting is not None:
            fields["ranks"] = [f"rank {waiting['rank']} waited (the watchdog's rank)"]
        rank = re.match(r"OVERFLOW! Rank (\d{1,9})", tail[at:])
        if signal == "deepspeed-overflow" and rank is not None:
            fields["ranks"] = [logging_rank(rank[1], every_rank=False)]  # loss_scaler.py's `OVERFLOW! Rank N`
        return BY_ID[signal], fields
    return None
