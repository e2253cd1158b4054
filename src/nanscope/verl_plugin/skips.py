"""Skip mode's count and the learning rate it holds (NANSCOPE_ON_NONFINITE=skip).

Every rank skips or none does: the decision is the step's vote (slime_plugin.step_vote). A skipped step has its
gradients zeroed and its optimizer step not taken; `optimizer_step` returns grad_norm NaN, as verl's own FSDP skip
logs it (verl v0.9.0 verl/workers/engine/fsdp/transformer_impl.py:793-798). verl advances the learning-rate
schedule once per update_actor, after its last mini-batch, whatever happened to the step
(verl/workers/engine_workers.py:307, 367-370): the plugin holds it when every optimizer step since the last
schedule step was skipped (nothing was learnt, so the schedule does not move), as slime's skip does.
"""

from __future__ import annotations


class Skips:
    """Skip mode's counters, and whether the next optimizer step is skipped."""

    def __init__(self, max_skips: int | None):
        self.max_skips = max_skips
        self.skipped = self.in_a_row = 0
        self.pending = False  # the next optimizer_step is skipped
        self.applied_since_lr = False  # an optimizer step was taken since the last schedule step
        self.skipped_since_lr = False

    def record(self, skip: bool) -> None:
        """The step's vote is in: `skip` it (count it) or not."""
        if skip:
            self.skipped, self.in_a_row, self.pending = self.skipped + 1, self.in_a_row + 1, True
        else:
            self.in_a_row = 0

    def over_limit(self) -> bool:
        return self.max_skips is not None and self.in_a_row >= self.max_skips

    def take(self) -> bool:
        """optimizer_step is called: True if it is skipped (once per vote)."""
        skip, self.pending = self.pending, False
        if skip:
            self.skipped_since_lr = True
        else:
            self.applied_since_lr = True
        return skip

    def advance_lr(self) -> bool:
        """lr_scheduler_step is called: True to advance the schedule (False: every step since the last was skipped)."""
        advance = self.applied_since_lr or not self.skipped_since_lr
        self.applied_since_lr = self.skipped_since_lr = False
        return advance
