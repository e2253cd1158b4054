"""A loss scale Megatron's iteration lines print unchanged while every iteration they cover is skipped.

Megatron-LM's dynamic scaler lowers its scale on an overflow once its hysteresis is spent (`--hysteresis`, default 2:
core_v0.15.0rc0 megatron/core/optimizer/grad_scaler.py:115-120, megatron/training/arguments.py:2291); it gets the
hysteresis back only after `growth_interval` clean iterations (grad_scaler.py:123-130). A static `--loss-scale` never
moves (ConstantGradScaler, grad_scaler.py:38-44), and its overflowing steps are skipped all the same
(optimizer/optimizer.py:553-555). So a scale held over n more skipped iterations in a row, after a line whose own
iterations were all skipped, is static, at its floor (`--min-loss-scale`), or its hysteresis is at least n + 2.

     iteration 1/ ... | loss scale: 16384.0 | number of skipped iterations: 1 |
     iteration 2/ ... | loss scale: 16384.0 | number of skipped iterations: 1 |    -> held over 3 more: not
     ...                                                                             a calibration (holdout12 09)
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "core_v0.15.0rc0 megatron/core/optimizer/grad_scaler.py:38-44, :115-130; megatron/training/arguments.py:2291"
MIN_HELD = 2  # skipped iterations after the first line at one scale: a default hysteresis (2) would have lowered it


@dataclass
class HeldScale:
    """The run of iteration lines that print one scale while their skip counter covers every iteration."""

    run: tuple[float, int, int] | None = None  # (the scale, the run's first iteration, skipped after its first line)
    held: tuple[float, int, int, int] | None = None  # (the scale, first and last iteration, skipped after the first)

    def feed(self, scale: float, step: int | None, skipped: float | None, interval: int | None) -> None:
        """One line's scale, its iteration `step`, its skip counter, and the iterations since the line before it
        (`interval`: None where lines may be cut out between them; the first line covers iterations 1 to `step`)."""
        covers = interval if interval is not None else (step if self.run is None else None)
        if step is None or skipped is None or skipped <= 0 or skipped != covers:
            self.run = None
            return
        if self.run is None or self.run[0] != scale:
            self.run = (scale, step - int(skipped) + 1, 0)
            return
        held, start, after = scale, self.run[1], self.run[2] + int(skipped)
        self.run = (held, start, after)
        if after >= MIN_HELD:
            self.held = (held, start, step, after)

    def sentence(self, shown) -> str | None:
        """The held scale in words (`shown`: a scale as printed); None: none held."""
        if self.held is None:
            return None
        scale, start, end, after = self.held
        return (f"The loss scale stays {shown(scale)} while every iteration from {start} to {end} is skipped (the "
                f"skip counter covers each line's iterations): Megatron's dynamic scaler lowers it once its "
                f"hysteresis (default 2) is spent, so over {after} more skipped iterations in a row it would have "
                f"fallen; the scale is static (--loss-scale, whose overflowing steps are skipped all the same), at its "
                f"floor (--min-loss-scale), or the hysteresis is at least {after + 2}: not a calibration, and no "
                f"iteration from {start} to {end} updated the weights ({SOURCE}).")  # fmt: skip

    def points_to(self) -> str | None:
        """What a held scale points to, for the summary (None: none held)."""
        if self.held is None:
            return None
        _, start, end, _ = self.held
        return (f"gradients that overflow at a loss scale that does not move: every iteration from {start} to {end} "
                "skipped, none of them an update of the weights")  # fmt: skip
