"""What the `nanscope` loss mode saw in each call of a step: handed to the engine's step through a context variable.

verl calls a registered policy loss with fixed arguments (verl v0.9.0 verl/workers/utils/losses.py:101-112) and
forces whatever metrics it returns to a MEAN (:116), which reads each to the host (`Metric.append` calls
`.item()`, verl/utils/metric/utils.py:104-107). So the loss mode returns the inner mode's metrics unchanged and
puts its own numbers (device tensors, no host read) on the record the engine's loss wrapper opened for the call
(`opened`); the engine's step adds them up once, in its vote. Outside an engine step (a unit test, another
caller) no record is open and the loss mode keeps nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import torch

from nanscope.loss.padded import Headroom


@dataclass
class Call:
    """One call of the policy loss inside the engine's step (tensors on the run's device, this step only).

    Attributes:
        microbatch: 0-based, the engine's loss calls this pass on this rank.
        headroom: the loss mode's `padded.Headroom` (None: the loss mode is not `nanscope`).
        inputs: [B, T] tensors as the loss mode received them (old_log_prob, log_prob detached, advantages,
            response_mask, rollout_is_weights), for the repro bundle; empty without the loss mode.
        loss: 0-dim detached loss the engine's loss function returned, None until it returned.
        batch: the micro-batch's normalisation numbers (dp_size, batch_num_tokens, global_batch_size), host numbers.
    """

    microbatch: int
    batch: dict = field(default_factory=dict)
    headroom: Headroom | None = None
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    loss: torch.Tensor | None = None


_OPEN: contextvars.ContextVar[Call | None] = contextvars.ContextVar("nanscope_verl_loss_call", default=None)


def current() -> Call | None:
    """The call the engine's loss wrapper opened, None outside one."""
    return _OPEN.get()


@contextlib.contextmanager
def opened(call: Call):
    """`call` is the current one while the engine's loss function runs."""
    token = _OPEN.set(call)
    try:
        yield call
    finally:
        _OPEN.reset(token)
