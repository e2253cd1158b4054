"""One run on one rank of the harness: what its steps use, made once when the run starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from nanscope.megatron.spec import Layout, RankRecord, RunSpec
from nanscope.slime_plugin.settings import Settings


@dataclass
class RunContext:
    """One run on this rank: everything its steps use, made once when the run starts."""

    index: int  # the run's position in the spec
    spec: RunSpec
    layout: Layout
    out: Path
    record: RankRecord  # filled in as the run goes
    vocab_size: int
    loss_flags: dict  # the case's slime loss flags (the parent read them from its launch.sh)
    model: Any = None  # DDP(Float16Module(GPTModel)) once built
    transformer_config: Any = None  # megatron's TransformerConfig of the model
    optimizer: Any = None
    hook: ModuleType | None = None  # nanscope.slime_plugin when spec.hook (before_train_step, ...)
    tracer: Any = None  # the nanscope.trace.tracer.locator.Tracer of the current step when spec.trace
    grads_path: Path | None = None  # where train_one_step saves the main grads (spec.save_grads)
    sentinel: Any = None  # nanscope.trace.sentinels.sentinel.Sentinel on the model, read after every step
    step: int = 0  # the current step (1-based); a planted model fault reads it
    loss_overrides: dict = field(default_factory=dict)  # slime loss fields the step's hazard sets
    output_grads: list = field(default_factory=list)  # per micro-batch: the output's gradient is finite (0-dim)
    error_time: float | None = None  # when megatron's check raised on this rank (cpu_distributed.agree_on_grad_check)

    @property
    def name(self) -> str:
        return f"run {self.index}"

    def path(self, kind: str, suffix: str = ".pt", run: int | None = None) -> Path:
        """This rank's file of this run (or of run `run`) in the output dir, e.g. params.run3.rank1.pt."""
        return self.out / f"{kind}.run{self.index if run is None else run}.rank{self.record.rank}{suffix}"

    def hook_settings(self) -> Settings:
        """The plugin's settings for this run: what its launch would set in the environment, as one object."""
        values = {
            "NANSCOPE_ON_NONFINITE": self.spec.on_nonfinite,
            "NANSCOPE_REPORT_DIR": str(self.out / f"reports.run{self.index}"),
            **self.spec.env,
        }
        return Settings.from_env(values)

    @property
    def rollouts(self) -> str | None:
        """--save-debug-rollout-data of a plugin run: where each step's rollout goes."""
        return str(self.out / f"rollouts.run{self.index}" / "{rollout_id}.pt") if self.spec.plugin else None
