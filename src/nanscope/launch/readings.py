"""What the metric lines said (launch.metric_lines): the first line with a non-finite value (`Reading`), and a
counter of skipped or NaN steps that rose (`Counter`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.launch import line_steps
from nanscope.launch.scales import SKIP_COUNTER

# key (lowered, last part) -> cumulative; a counter of skipped or NaN steps
COUNTERS = {SKIP_COUNTER: False, "number of nan iterations": False, "inf_nan_skip_batches": True,
            "skipped": True, "skipped_steps": True}  # fmt: skip


@dataclass
class Reading:
    """The first metric line with a non-finite value.

    Attributes:
        line: its line in the log.
        step: the step it names, or that its progress bar gives (None: not said).
        step_from: where the step came from.
        after: the last step an earlier metric line named, when this one names none.
        values: the non-finite (key, value) pairs, in the line's order: the first is `metric` (a loss Megatron did
            not print comes after the printed ones).
        model: actor, critic, policy, reference, reward model, or None (one model alone is not named).
        finite: the line's finite loss and gradient-norm values, key -> value.
        points_to: what that points to, in one phrase.
        text: the line, cut.
        weak: only a loss Megatron did not print (weak evidence alone: NaN, <= 0, or skipped iterations).
        contradicted: the finite values on the line that contradict its non-finite ones (a progress bar's running
            mean NaN beside a finite reduced loss), in words; None: nothing contradicts them.
        fragment: the input's first line, cut at its start, that held non-finite values before this line (its text).
    """

    line: int
    step: int | None
    step_from: str | None
    after: int | None
    values: list[tuple[str, str]]
    model: str | None
    finite: dict[str, float]
    points_to: str
    text: str
    weak: bool = False
    contradicted: str | None = None
    fragment: str | None = None
    epoch: str | None = None  # the line's `epoch` value where it names no step (transformers' Trainer: 0.52)
    ranks: list[int] = field(default_factory=list)  # the ranks its line, and the later lines of its step, name
    # (`... grad_norm nan rank 2`: each process logs its own line)

    @property
    def metric(self) -> str:
        return self.values[0][0]

    @property
    def printed(self) -> str | None:
        """Its step as the text prints it, where rounded (`1.53e+05`); None: exact, or none."""
        return line_steps.printed(self.step_from) if self.step is not None else None

    @property
    def said_epoch(self) -> str | None:
        """`epoch` where it says something: a number above 0 (a Trainer's `0.0` in its first hundredth of an epoch
        says nothing)."""
        try:
            return self.epoch if self.epoch is not None and float(self.epoch) > 0 else None
        except ValueError:
            return None

    def to_dict(self) -> dict:
        return {"line": self.line, "step": self.step, "step_from": self.step_from, "after_step": self.after,
                "metric": self.metric, "model": self.model, "values": [list(pair) for pair in self.values],
                "finite": self.finite, "points_to": self.points_to, "text": self.text, "weak": self.weak,
                "contradicted": self.contradicted, "cut_first_line": self.fragment, "epoch": self.epoch, "ranks": self.ranks}  # fmt: skip


@dataclass
class Counter:
    """A skip counter that rose: steps with inf/NaN gradients skipped."""

    key: str
    value: int
    line: int
    step: int | None
    cumulative: bool
    last: tuple[int, int | None, int] | None = None  # a cumulative counter's last reading above its first: (value,
    # step, line)
    named: int | None = None  # the step its line names (a cumulative counter's rise may be earlier)

    def to_dict(self) -> dict:
        last = None if self.last is None else dict(zip(("value", "step", "line"), self.last, strict=True))
        return dict(key=self.key, value=self.value, line=self.line, step=self.step, cumulative=self.cumulative,
                    last=last)  # fmt: skip

    def rise(self) -> str:
        """Where a cumulative counter ended up, in words (`, to 1586 by step 2500 (line 38)`); '' if it did not."""
        if self.last is None:
            return ""
        value, step, line = self.last
        by = f" by step {step}" if step is not None else ""
        share = f": {value} of {step} steps skipped" if step else ""
        return f", to {value}{by} (line {line}){share}"


def found_counters(counters: list[Counter], seen: dict[str, int], found, number: int, step: int | None) -> None:
    """The skip counters among a metric line's pairs (`found`, line `number`, its step `step`): one that rose joins
    `counters`; `seen`: each counter's last value (key lowered)."""
    for key, value, _ in found:
        name = key.lower()
        if name not in COUNTERS or (count := line_steps.number(value)) is None:
            continue
        count, before = int(count), seen.get(name)
        seen[name] = count
        cumulative = COUNTERS[name]
        rose = count > 0 and (not cumulative or before is None or count > before)
        kept = next((counter for counter in counters if counter.key == key), None)
        if kept is not None and cumulative and count > kept.value:  # where it ended up: how many steps skipped
            kept.last = (count, step, number)
        if rose and kept is None:
            known = step if (not cumulative or (before is not None and count > before)) else None
            counters.append(Counter(key, count, number, known, cumulative, named=step))
