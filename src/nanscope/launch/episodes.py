"""A second non-finite episode in a log's metric lines: after the first non-finite reading, a line where its metric
is finite again, then a line where it is non-finite again.

A paste of two runs (a retry, then the run it retried), or a run resumed from a checkpoint, reads so: the first
reading is one run's, the second episode the other's, and a reader wants both steps. Isolated non-finite gradient
norms beside a finite loss (a dynamic loss scaler's skipped steps) are not episodes: the caller starts a watch only
for a first reading that is not norm-only (launch.metric_lines).

    episodes = Episodes()
    episodes.start("lm loss", step=2)                              # the first reading's metric and step
    episodes.feed(4, 226, [("lm loss", False), ("grad norm", False)])   # each later metric line: (key, non-finite)
    episodes.feed(6, 228, [("lm loss", True), ...])
    episodes.again   # Again(line=6, step=228, metric='lm loss', finite_line=4, finite_step=226, went_back=False)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Again:
    """The first line where the first reading's metric is non-finite again, after a line where it was finite.

    Attributes:
        line, step: that line and the step it names (None: none).
        metric: the metric, as the line prints its key.
        finite_line, finite_step: the first line after the first reading where the metric was finite, and its step.
        went_back: the step counter went below the first reading's step in between (a restarted or resumed run, or
            a second paste of an earlier part).
    """

    line: int
    step: int | None
    metric: str
    finite_line: int
    finite_step: int | None
    went_back: bool

    def sentence(self, first_step: int | None) -> str:
        """In words, for the verdict (`first_step`: the first reading's)."""
        at = f"step {self.step} (line {self.line})" if self.step is not None else f"line {self.line}"
        since = f"step {self.finite_step} (line {self.finite_line})" if self.finite_step is not None else (
            f"line {self.finite_line}")  # fmt: skip
        back = ""
        if self.went_back:
            back = (f"; the step counter goes back below step {first_step} in between: another run (restarted, "
                    "resumed, or a second paste), so each run's first non-finite step is one of these")  # fmt: skip
        return f"{self.metric} is non-finite again at {at}, after finite lines from {since}{back}."

    def to_dict(self) -> dict:
        return {"line": self.line, "step": self.step, "metric": self.metric, "finite_line": self.finite_line,
                "finite_step": self.finite_step, "step_went_back": self.went_back}  # fmt: skip


@dataclass
class Episodes:
    """The watch for a second episode of one metric (its key lowered), once `start`ed."""

    metric: str | None = None
    first_step: int | None = None
    finite: tuple[int, int | None] | None = None  # the first line after the first reading with the metric finite
    went_back: bool = False
    again: Again | None = None

    def start(self, metric: str, step: int | None) -> None:
        self.metric, self.first_step = metric.lower(), step

    def waiting(self) -> bool:
        """Started, and no line with the metric finite yet: the caller reads the lines holding its key (a finite
        line is no candidate line of a log; the non-finite ones after it are)."""
        return self.metric is not None and self.finite is None

    def feed(self, number: int, step: int | None, values: list[tuple[str, bool]]) -> None:
        """A metric line after the first reading: its step (None: it names none) and (key, non-finite) pairs."""
        if self.metric is None or self.again is not None:
            return
        state = next((bad for key, bad in values if key.lower() == self.metric), None)
        if state is None:
            return  # a line without the metric (an eval record, another model's line)
        if step is not None and self.first_step is not None and step < self.first_step:
            self.went_back = True
        if not state and self.finite is None:
            self.finite = (number, step)
        elif state and self.finite is not None:
            line, finite_step = self.finite
            self.again = Again(
                line=number,
                step=step,
                metric=self._shown(values),
                finite_line=line,
                finite_step=finite_step,
                went_back=self.went_back,
            )

    def _shown(self, values: list[tuple[str, bool]]) -> str:
        return next(key for key, _ in values if key.lower() == self.metric)
