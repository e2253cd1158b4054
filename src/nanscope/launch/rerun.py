"""The rerun state machine's verdict, when a log has one (`facts.wordings.VERDICTS`).

With the rerun state machine enabled (megatron-core 0.10 on, `--rerun-mode validate_results`), a rejected result is
logged, the step is rerun on the same GPU, and, when that reproduces it, once more on another GPU after a checkpoint:

    First rerun: unexpected result is reproducible within the tolerance (nan = nan). Need to rerun on ...
    Rank 3, node n1, device 3: Possible transient error!                        (log_failure, core 0.10 to 0.15)
    Rank 3, node n1, device 3, iteration #3: First rerun: unexpected ... !      (log_failure, core 0.16 on)

`line_verdict(line, number)` reads one line; the second rerun's verdict is the machine's last word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nanscope.facts import wordings

_PREFIX = re.compile(
    r"Rank (?P<rank>\d{1,18}), node (?P<node>[^\s,]+), device (?P<device>\d{1,18}|cpu)"
    r"(?:, iteration #(?P<iteration>-?\d{1,18}))?: "
)
_WINDOW = 512  # characters after the verdict's words where its `(result != initial)` is read
# log_failure's conclusions (core 0.10 to 0.15 print them after the verdict line, on their own)
_CONCLUSIONS = (
    (wordings.TRANSIENT, "first-not"),
    (wordings.PERSISTENT, "second-not"),
    ("Correct result (but possible Application error)", "second-yes"),
)


@dataclass
class Rerun:
    """The rerun state machine's verdict on a rejected result.

    Attributes:
        key: facts.wordings.VERDICTS key (first-not, first-yes, second-not, second-yes).
        rerun: "first" (the same GPU) or "second" (another GPU).
        reproducible: the rerun gave the same result.
        verdict: transient | reproducible-same-gpu | persistent-fault | application.
        means: what it says about the cause, in words.
        rank, node, device, iteration: the `Rank R, node N, device D[, iteration #I]: ` prefix, when the line has one.
        values: `result != initial` or `result = initial` as printed, when the line has them.
    """

    key: str
    rerun: str
    reproducible: bool
    verdict: str
    means: str
    text: str
    line: int
    rank: int | None = None
    node: str | None = None
    device: int | str | None = None
    iteration: int | None = None
    values: str | None = None

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "rerun": self.rerun,
            "reproducible": self.reproducible,
            "means": self.means,
            "rank": self.rank,
            "node": self.node,
            "device": self.device,
            "iteration": self.iteration,
            "values": self.values,
            "line": self.line,
            "text": self.text,
        }


def line_verdict(line: str, number: int) -> Rerun | None:
    """The verdict one line states, or None."""
    key, at = None, -1
    for verdict in wordings.VERDICTS:
        at = line.find(verdict.start)
        if at >= 0:
            key = verdict.key
            break
    if key is None:
        for text, conclusion in _CONCLUSIONS:
            at = line.find(text)
            if at >= 0:
                key = conclusion
                break
    if key is None:
        return None
    record = wordings.BY_VERDICT[key]
    prefix = None
    start = line.rfind("Rank ", 0, at)
    if start >= 0:
        prefix = _PREFIX.match(line, start)
        prefix = prefix if prefix is not None and prefix.end() == at else None
    values = _values(line, at)
    rerun = Rerun(
        key=key,
        rerun=record.rerun,
        reproducible=record.reproducible,
        verdict=record.verdict,
        means=record.means,
        text=line[prefix.start() if prefix else at :].strip(),
        line=number,
        values=values,
    )
    if prefix is not None:
        rerun.rank, rerun.node = int(prefix["rank"]), prefix["node"]
        rerun.device = int(prefix["device"]) if prefix["device"].isdigit() else prefix["device"]
        rerun.iteration = None if prefix["iteration"] is None else int(prefix["iteration"])
    return rerun


def _values(line: str, at: int) -> str | None:
    """`result != initial` (or `=`) from the first `( ... )` after `at` that holds one, within _WINDOW characters.
    Literal searches, each from where the last ended: linear in the window (a pattern of lazy groups around an
    alternation was cubic on a line of repeated `( = `)."""
    window = line[at : at + _WINDOW]
    start = window.find("(")
    while start >= 0:
        end = window.find(")", start)
        if end < 0:
            return None
        inner = window[start + 1 : end]
        found = [(i, op) for op in (" != ", " = ") if (i := inner.find(op)) >= 0]
        if found:
            i, op = min(found)
            return f"{inner[:i]} {op.strip()} {inner[i + len(op) :]}"
        start = window.find("(", end)
    return None


def last_word(verdicts: list[Rerun]) -> Rerun | None:
    """The machine's last word: the second rerun's verdict over the first's, the later line among equals; a
    verdict line carries the values, its log_failure conclusion the rank, node and device: they are merged."""
    if not verdicts:
        return None
    best = max(verdicts, key=lambda verdict: (verdict.rerun == "second", verdict.line))
    for other in verdicts:
        if other.key == best.key and other is not best:
            best.rank = best.rank if best.rank is not None else other.rank
            best.node = best.node or other.node
            best.device = best.device if best.device is not None else other.device
            best.iteration = best.iteration if best.iteration is not None else other.iteration
            best.values = best.values or other.values
    return best
