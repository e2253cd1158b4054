"""Classify a non-finite step: which class of cause the sentinel's reading points to, and why.

Megatron says only "found NaN in local grad norm for bucket #0". The sentinel says where the first
non-finite value appeared; this module turns that, plus what the loss saw, into one of five classes
(or, when the evidence cannot decide, the classes that remain):

    data            non-finite log-probs, rewards or advantages reach the loss
    loss-numerics   the model's forward is finite, the loss inputs are finite, and the gradient the
                    loss sends into the model (d loss / d logits) is not: the loss's own ops (an exp
                    that overflows before its clamp) produced it
    model-forward   the first non-finite output in forward order is inside the model: layer L, module M
    model-backward  a module's parameter gradient is non-finite while the forward was finite and the
                    gradient arriving at the model's output was finite
    optimizer       parameters are non-finite although the gradients were finite (an update wrote them)

The checks run in this order: the forward first (a faulty forward also poisons the log-prob pass, so
it comes before data), then the loss inputs, then the backward, then the parameters after the step.
docs/cause.md has the same rules as a table.

Pure: no torch.distributed, no model. `classify(Observation(...))` -> `Classification`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nanscope.causes.classes import DATA, LOSS_NUMERICS, MODEL_BACKWARD, MODEL_FORWARD, OPTIMIZER

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class Observation:
    """What one step showed on one rank.

    Attributes:
        forward: the sentinel's first non-finite module output in forward order (a `reading.Hit`:
            module, microbatch), or None.
        backward: the sentinel's first non-finite parameter gradient in backward order (a Hit with
            `param`), or None.
        grads: parameters whose accumulated gradient is non-finite (the sentinel's `Reading.grads`).
        loss_inputs: batch key -> (non-finite entries, entries) of what reached the loss
            (log_probs, ref_log_probs, rollout_log_probs, advantages); None: not observed.
        output_grad_finite: whether the gradient arriving at the model chunk's output was finite
            (d loss / d logits on the last pipeline stage); None: not observed.
        last_stage: this rank holds the loss (otherwise the output gradient came from the next stage).
        nonfinite_params: parameters that are non-finite after the optimizer step.
        layer_offset: global index of this stage's first decoder layer (megatron names layers locally).
        producer: from the sentinel's output-gradient checks (a `reading.Producer`: the module whose
            own backward made the first non-finite gradient at a module output), or None.
    """

    forward: object | None = None
    backward: object | None = None
    grads: tuple[str, ...] = ()
    loss_inputs: dict[str, tuple[int, int]] | None = None
    output_grad_finite: bool | None = None
    last_stage: bool = True
    nonfinite_params: tuple[str, ...] = ()
    layer_offset: int = 0
    producer: object | None = None


@dataclass
class Classification:
    """The verdict on one step.

    Attributes:
        cls: one of CLASSES, or None when nothing is non-finite or the evidence cannot decide.
        candidates: the classes still possible (one when decided, none when all is finite).
        evidence: one line per observation that decided it.
        module: the module named by the evidence (forward: the first non-finite output; backward:
            the first non-finite gradient), or None.
        direction: "forward" or "backward" for the module, else None.
        microbatch: the 0-based micro-batch of that module's hit, else None.
    """

    cls: str | None
    candidates: tuple[str, ...]
    evidence: list[str] = field(default_factory=list)
    module: str | None = None
    direction: str | None = None
    microbatch: int | None = None

    @property
    def finite(self) -> bool:
        return not self.candidates

    def to_dict(self) -> dict:
        return {
            "class": self.cls,
            "candidates": list(self.candidates),
            "evidence": list(self.evidence),
            "module": self.module,
            "direction": self.direction,
            "microbatch": self.microbatch,
        }


def layer_of(module: str, offset: int = 0) -> int | None:
    """The global decoder-layer index in a module path (`decoder.layers.1.mlp` -> 1 + offset), or None."""
    match = _LAYER.search(module)
    return None if match is None else int(match[1]) + offset


def _where(module: str, offset: int) -> str:
    layer = layer_of(module, offset)
    return f"module {module}" + ("" if layer is None else f" (decoder layer {layer})")


def _names(names: tuple[str, ...], shown: int = 3) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _bad_inputs(loss_inputs: dict[str, tuple[int, int]]) -> list[str]:
    return [
        f"{name}: {bad} of {total} entries non-finite" + (" (all)" if bad == total else "")
        for name, (bad, total) in loss_inputs.items()
        if bad
    ]


def classify(obs: Observation) -> Classification:
    """The class of cause the observation points to (see the module docstring for the rules)."""
    if obs.forward is not None:
        return _forward(obs)
    if obs.loss_inputs and _bad_inputs(obs.loss_inputs):
        return _data(obs.loss_inputs)
    if obs.backward is not None or obs.grads:
        return _backward(obs)
    if obs.nonfinite_params:
        return Classification(
            OPTIMIZER,
            (OPTIMIZER,),
            [
                "the forward, the loss inputs and every gradient were finite",
                f"non-finite parameters after the step: {_names(obs.nonfinite_params)}: the optimizer update wrote them",
            ],
        )
    return Classification(None, (), ["no non-finite module output, loss input, gradient or parameter"])


def _forward(obs: Observation) -> Classification:
    hit = obs.forward
    evidence = [
        f"first non-finite output in forward order: {_where(hit.module, obs.layer_offset)}, micro-batch {hit.microbatch}",
        "every module before it in forward order gave finite outputs",
    ]
    if obs.nonfinite_params:
        evidence.append(
            f"non-finite parameters: {_names(obs.nonfinite_params)} (an earlier update may have written them)"
        )
    return Classification(
        MODEL_FORWARD, (MODEL_FORWARD,), evidence, module=hit.module, direction="forward", microbatch=hit.microbatch
    )


def _data(loss_inputs: dict[str, tuple[int, int]]) -> Classification:
    evidence = ["the model's forward was finite", "non-finite loss inputs: " + "; ".join(_bad_inputs(loss_inputs))]
    bad, total = loss_inputs.get("log_probs", (0, 0))
    if total and bad == total:
        evidence.append(
            "every log-prob is non-finite: the log-prob pass itself failed (a zero "
            "--rollout-temperature divides the logits by 0)"
        )
    return Classification(DATA, (DATA,), evidence)


def _backward(obs: Observation) -> Classification:
    hit = obs.backward
    if hit is not None:
        module, mb = hit.module, hit.microbatch
        where = (
            f"first non-finite parameter gradient in backward order: {hit.param} "
            f"({_where(module, obs.layer_offset)}), micro-batch {mb}"
        )
    else:
        module, mb = obs.grads[0].rpartition(".")[0], None
        where = f"non-finite accumulated gradient: {obs.grads[0]} (no per-call hook saw it: a fused kernel)"
    seen = obs.loss_inputs is not None  # and finite: _data took the non-finite ones
    data = () if seen else (DATA,)
    inputs = "every loss input was finite" if seen else "the loss inputs were not observed"
    if not obs.last_stage:
        inputs = "the loss runs on the last pipeline stage"
    evidence = ["the model's forward was finite", inputs, where]
    made = obs.producer
    if made is not None and made.module is not None:  # the module whose backward made it, not only a param it reached
        module, mb = made.module, made.microbatch
        evidence.append(
            f"first non-finite gradient at a module output in backward order: at {made.seen_at}'s output, "
            f"micro-batch {mb}, checked right after the finite gradient at {made.module}'s output: "
            f"{_where(module, obs.layer_offset)}'s own backward made it"
        )
    if obs.output_grad_finite is None:
        evidence.append(
            "the gradient arriving at the model's output was not observed: it was non-finite if "
            "the loss produced the value, finite if this module's backward did (one rerun under "
            "`nanscope trace` tells)"
        )
        return Classification(
            None, (*data, LOSS_NUMERICS, MODEL_BACKWARD), evidence, module=module, direction="backward", microbatch=mb
        )
    if obs.output_grad_finite:
        evidence.append(
            "the gradient arriving at the model's output was finite: this module's backward "
            "produced the non-finite value"
        )
        return Classification(
            MODEL_BACKWARD, (MODEL_BACKWARD,), evidence, module=module, direction="backward", microbatch=mb
        )
    if not obs.last_stage:
        evidence.append(
            "the gradient arrived non-finite from the next pipeline stage: the cause is "
            "downstream (read the next stage's report)"
        )
        candidates = (DATA, LOSS_NUMERICS, MODEL_FORWARD, MODEL_BACKWARD)
        return Classification(None, candidates, evidence, module=module, direction="backward", microbatch=mb)
    evidence.append(
        "the gradient the loss sent into the model (d loss / d logits) was non-finite"
        + (": the loss's backward produced it (`nanscope trace` names the op)" if seen else "")
    )
    cls = LOSS_NUMERICS if seen else None
    return Classification(cls, (*data, LOSS_NUMERICS), evidence, module=module, direction="backward", microbatch=mb)
