"""Skip mode (NANSCOPE_ON_NONFINITE=skip): every rank agrees to drop a non-finite step, or none does.

The decision is the step's vote (`step_vote`: every rank's sentinel, one all-gather), so every rank skips or
none does; replicas that disagreed would diverge. A skipped step has its gradients zeroed on every chunk, returns grad norm NaN from
optimizer.step (slime treats it as an invalid step) and does not advance the learning-rate schedule.
"""

from __future__ import annotations


class SkipVote:
    """The skip decision of one installation and its counters."""

    def __init__(self, chunks, max_skips: int | None):
        self.chunks, self.max_skips = chunks, max_skips
        self.skipped = self.in_a_row = 0
        self.skip_step = self.skipped_now = False  # this step: skip its optimizer step / it was skipped

    def begin(self) -> None:
        self.skip_step = self.skipped_now = False

    def apply(self, any_bad: bool) -> bool:
        """The step's vote said some rank saw a non-finite value (`step_vote`): zero the gradients, skip the step."""
        if any_bad:
            for chunk in self.chunks:
                chunk.zero_grad_buffer()
            self.skip_step = True
            self.skipped, self.in_a_row = self.skipped + 1, self.in_a_row + 1
            return True
        self.in_a_row = 0
        return False

    def over_limit(self) -> bool:
        return self.max_skips is not None and self.in_a_row >= self.max_skips

    def optimizer_step(self, step):
        """optimizer.step wrapped: a skipped step does nothing and returns grad norm NaN."""

        def wrapped(*args, **kwargs):
            if self.skip_step:  # gradients zeroed: no update; a NaN grad norm says "not a real step"
                self.skip_step, self.skipped_now = False, True
                return True, float("nan"), None
            return step(*args, **kwargs)

        return wrapped

    def scheduler_step(self, step):
        """scheduler.step wrapped: a skipped step does not advance the learning-rate schedule."""

        def wrapped(*args, **kwargs):
            if self.skipped_now:
                return None
            return step(*args, **kwargs)

        return wrapped
