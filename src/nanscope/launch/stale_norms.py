"""The gradient norm a metric line logs after a DeepSpeed overflow line: the skipped step's is the one before it, so a
norm repeated unchanged after each overflow is the mark of steps skipped, not of a norm that stopped moving.

DeepSpeed's ZeRO and FP16 optimizers return from step() on an overflow before they compute the norm (0.16.4
zero/stage_1_and_2.py:1839-1853, fp16/fused_optimizer.py:263-275), so get_global_grad_norm() still holds the last
applied step's: transformers' Trainer logs it as `'grad_norm': 4.5`,
Megatron-DeepSpeed as its iteration line's `grad norm: 464441.887` (the engine's norm: deepspeedai/Megatron-DeepSpeed
4efb479 megatron/training.py:683, printed at :1168; holdout23 05 repeats one after each of six overflows).

    norms = StaleNorms()
    norms.overflow(line, lines_before)           # an overflow line: wait for the next norm logged
    norms.ahead(block, start, line, clean)       # ... looked for in the lines after it in its block
    norms.logged(text, line)                     # a metric line read later
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.launch.line_pairs import pairs

STALE_WITHIN = 20  # lines after an overflow where the next logged norm is the skipped step's
KEYS = ("grad_norm", "grad norm")  # as transformers' Trainer and Megatron's iteration line print it
NEEDLES = tuple(key.encode() for key in KEYS)


def grad_norm(lines: list[str]) -> tuple[str, str] | None:
    """The last gradient norm `lines` print: (its key, its value, as printed); None: none."""
    found = None
    for line in lines:
        low = line.lower()
        if KEYS[0] not in low and KEYS[1] not in low:  # a literal search first: most lines hold none
            continue
        for key, value, _ in pairs(line):
            if key.lower().rsplit("/", 1)[-1] in KEYS:
                found = (key.rsplit("/", 1)[-1], value.strip("'\""))
    return found


@dataclass
class StaleNorms:
    """The norms logged after overflow lines (bounded: a few numbers)."""

    pending: tuple[int, str | None] | None = None  # the last overflow's line and the norm before it, not yet followed
    first: tuple[int, str, str | None] | None = None  # the first norm logged after an overflow: (line, value, before)
    key: str = "grad_norm"  # the first's key, as printed
    followed: int = 0  # overflows followed by a norm, the one before them known
    same: int = 0  # of them, the norm logged after the same as the one before

    def overflow(self, line: int, before: list[str]) -> None:
        """An overflow line at `line` (`before`: the lines before it): the next norm logged is the skipped step's."""
        found = grad_norm(before)
        self.pending = (line, None if found is None else found[1])

    def ahead(self, block: bytes, start: int, number: int, clean) -> None:
        """The first norm in the STALE_WITHIN lines after the overflow line at `start` of `block` (a line in a later
        block is a candidate line there: NEEDLES). Each line is looked at once per overflow before it: linear."""
        end = block.find(b"\n", start)
        stop, count = end, 0
        while stop >= 0 and count < STALE_WITHIN:
            stop, count = block.find(b"\n", stop + 1), count + 1
        stop = len(block) if stop < 0 else stop
        found = [at for needle in NEEDLES if end >= 0 and (at := block.find(needle, end, stop)) >= 0]
        if found:
            begin = block.rfind(b"\n", 0, min(found)) + 1
            close = block.find(b"\n", min(found))
            line = clean(block[begin : len(block) if close < 0 else close].decode("utf-8", "replace"))
            self.logged(line, number + block.count(b"\n", start, begin))

    def logged(self, text: str, number: int) -> None:
        """A metric line at `number` after the pending overflow: its norm, if it logs one, is the skipped step's."""
        if self.pending is None:
            return
        line, before = self.pending
        if number - line > STALE_WITHIN:
            self.pending = None
            return
        found = grad_norm([text])
        if found is None:
            return
        self.pending = None
        if self.first is None:
            self.first, self.key = (number, found[1], before), found[0]
        if before is not None:
            self.followed += 1
            self.same += found[1] == before

    def sentence(self) -> str | None:
        """The first norm logged after an overflow, in words, and how often it repeats the one before (None: none)."""
        if self.first is None:
            return None
        line, value, before = self.first
        same = f", the same as before the overflow ({before})" if before == value else ""
        again = ""
        if self.followed > 1:
            again = (f"; of the {self.followed} overflow lines with a norm printed before and after, {self.same} "
                     "show it unchanged")  # fmt: skip
        return (f"{self.key} {value} at line {line} is the skipped step's, so the previous step's{same}{again}: "
                "DeepSpeed's ZeRO and FP16 optimizers return from the step on an overflow before computing the norm "
                "(0.16.4 zero/stage_1_and_2.py:1839-1853, fp16/fused_optimizer.py:263-275)")  # fmt: skip

    def to_dict(self) -> dict | None:
        return None if self.first is None else {"key": self.key, "followed": self.followed, "repeated": self.same}
