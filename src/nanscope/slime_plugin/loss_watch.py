"""What the release's policy loss received and computed this step, per micro-batch: observed, never changed.

The hook alone (over slime's own loss) receives neither the batch nor the logits. So at install it wraps the
release's loss module, to observe only:

    policy_loss_function        its arguments (args, the micro-batch) and its loss, per call
    get_log_probs_and_entropy   the current policy's per-token log-probs and entropy, as the release computed
                                them from the logits (a dict in v0.1.0, (empty, dict) from v0.2.4, tensors in
                                nanscope's model: `facts.releases.LossApi.log_prob_returns`)

The wrappers call the release's functions with the same arguments and return their results unchanged, so
slime's loss, gradient and metrics stay bitwise the same. They keep references (and detached log-probs) for
the current step only: `begin()` starts afresh. The plugin's own loss opens the record itself, with the batch
as slime handed it (before the guard cleans it); the release's entry, called inside, adds to that record.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from nanscope.loss.target import Target

_MISSING = object()


@dataclass
class Seen:
    """One micro-batch as the policy loss saw it (tensors on the run's device, for this step only).

    Attributes:
        index: 0-based, in the order of this step's loss calls on this rank.
        logp, entropy: [N] float32 detached: the current policy's per-token log-probs and entropy of this
            rank's local tokens (samples concatenated), None if the helper was not seen.
        loss: 0-dim detached loss the call returned, None until it returned.
        counts: the plugin's loss only: its guard's counters of this micro-batch ([len(loss.guard.COUNTERS)] float32
            on the device), which the step adds up and logs once through its vote; None for slime's own loss.
    """

    index: int
    args: object
    batch: dict
    microbatch: int | None = None  # the forward micro-batch it belongs to (the sentinel's numbering), if known
    parallel: object = None  # nanscope's model only: the loss's `parallel` (the harness simulates CP at the loss)
    logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    counts: torch.Tensor | None = None


class LossWatch:
    """The observing wrappers on one loss module, and what they saw this step."""

    def __init__(self, target: Target, microbatch=None):
        """`microbatch()`, if given, tells the forward micro-batch a loss call belongs to."""
        self.target, self._microbatch = target, microbatch
        self.seen: list[Seen] = []
        self._open: Seen | None = None
        self._wrapped: list[tuple[str, object, object]] = []  # (name, previous value, our wrapper)
        api = target.release
        self._wrap(api.entry, self._observing_entry)
        self._wrap(api.log_prob_helper, self._observing_helper)

    def _wrap(self, name: str, make) -> None:
        module = self.target.module
        previous = vars(module).get(name, _MISSING)
        wrapper = make(getattr(module, name))
        setattr(module, name, wrapper)
        self._wrapped.append((name, previous, wrapper))

    def remove(self) -> None:
        """Put the module's functions back (unless someone replaced our wrapper since)."""
        module = self.target.module
        for name, previous, wrapper in reversed(self._wrapped):
            if vars(module).get(name) is wrapper:
                setattr(module, name, previous) if previous is not _MISSING else delattr(module, name)
        self._wrapped.clear()

    def begin(self) -> None:
        self.seen.clear()
        self._open = None

    @contextlib.contextmanager
    def observing(self, args, batch: dict, parallel=None):
        """One policy-loss call: opens the micro-batch's record (the outermost call does; a recomputation of the
        same batch reopens its record), yields it; the caller sets `loss` from what the call returns."""
        if self._open is not None:  # the release's entry inside the plugin's loss: the record is open
            yield self._open
            return
        seen = next((s for s in self.seen if s.batch is batch), None)
        if seen is None:
            microbatch = self._microbatch() if self._microbatch is not None else None
            seen = Seen(index=len(self.seen), args=args, batch=batch, microbatch=microbatch, parallel=parallel)
            self.seen.append(seen)
        self._open = seen
        try:
            yield seen
        finally:
            self._open = None

    def _observing_entry(self, entry):
        @functools.wraps(entry)
        def policy_loss_observed(args, batch, *rest, **kwargs):
            with self.observing(args, batch, kwargs.get("parallel")) as seen:
                loss, metrics = entry(args, batch, *rest, **kwargs)
                seen.loss = loss.detach()
            return loss, metrics

        return policy_loss_observed

    def _observing_helper(self, helper):
        returns = self.target.release.log_prob_returns

        @functools.wraps(helper)
        def log_probs_observed(*args, **kwargs):
            out = helper(*args, **kwargs)
            if self._open is not None:
                self._open.logp, self._open.entropy = _per_token(out, returns)
            return out

        return log_probs_observed


def _per_token(out, returns: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(log-probs [N], entropy [N] or None), detached, from what the release's log-prob helper returned."""
    if returns == "tensors":
        logp, entropy = out
        return logp.detach(), None if entropy is None else entropy.detach()
    found = out if returns == "dict" else out[1]

    def cat(parts):
        return None if parts is None else torch.cat([p.detach().reshape(-1) for p in parts]) if parts else None

    return cat(found.get("log_probs")), cat(found.get("entropy"))
