"""What the sentinel read from one step: the first non-finite module output in forward order and parameter
gradient in backward order (each a `Hit`), the module whose own backward made a non-finite gradient
(`Producer`, with output-gradient checks), and the non-finite accumulated gradients: a `Reading`.

Torch-free: the classifier, the reports and the plugin's messages read these without the sentinel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nanscope.trace.sentinels import expert_counts


@dataclass
class Hit:
    """The first non-finite value of a phase.

    module: module path (names from named_modules(), "chunk<i>." prefix with several chunks);
    microbatch: 0-based micro-batch within the step; order: 0-based call index in the phase (forward:
    module-output checks, backward: parameter-gradient arrivals); param: backward, the parameter.
    """

    module: str
    microbatch: int
    order: int
    param: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Producer:
    """Where the first non-finite gradient at a module's output appeared in backward (output_grads=True).

    seen_at: the module at whose output it was seen; microbatch: the forward micro-batch of that output;
    module: the module whose output-gradient check ran just before it in that micro-batch's backward,
    with a finite gradient (the backward that produced the value: between the two checks only its own
    backward ran), or None when the gradient arrived non-finite at the first check of the micro-batch
    (from the loss, or from the next pipeline stage). order: 0-based index of the check at seen_at among
    the step's output-gradient checks.
    """

    module: str | None
    seen_at: str
    microbatch: int
    order: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Reading:
    """One step's sentinel result. grads: parameters whose accumulated gradient (main_grad if
    present, else .grad) is non-finite, when read(grads=True). producer: with output_grads=True.
    experts: the MoE layers' per-expert token counts (trace.sentinels.expert_tokens): of the failing micro-batch on a
    non-finite step, else only {"kept": how many (layer, micro-batch) counts}; None without MoE layers watched."""

    step: int
    forward: Hit | None
    backward: Hit | None
    grads: list = field(default_factory=list)
    producer: Producer | None = None
    experts: dict | None = None

    @property
    def finite(self) -> bool:
        return self.forward is None and self.backward is None and not self.grads and self.producer is None

    @property
    def microbatch(self) -> int | None:
        """The micro-batch of the first finding: forward, else the backward's producer, else the backward's."""
        first = self.forward or self.producer or self.backward
        return None if first is None else first.microbatch

    def expert_tokens(self, offset: int = 0) -> dict | None:
        """`experts` as a report writes it: public names, each layer's zero-token experts, and the zero-token finding
        (trace.sentinels.expert_counts); `offset` is the stage's first global decoder layer
        (trace.sentinels.observe.layer_offset)."""
        return expert_counts.public(self.experts, offset, None if self.backward is None else self.backward.param)

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "finite": self.finite,
            "forward": None if self.forward is None else self.forward.to_dict(),
            "backward": None if self.backward is None else self.backward.to_dict(),
            "grads": list(self.grads),
            "producer": None if self.producer is None else self.producer.to_dict(),
            "experts": self.experts,
        }
