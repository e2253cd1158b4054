"""A non-finite verl step's report and repro bundle, written when the vote finds it, before the rerun.

The files are the slime plugin's (`slime_plugin.outputs.Reports`: a temporary file renamed into place, never
through a link; a failed write is one warning line), named `rollout<U>_step<M>_rank<K>.json` and `.bundle.pt`,
where U is the actor update (verl's update_actor calls so far) and M the mini-batch (optimizer step) within it.
The critic's go under NANSCOPE_REPORT_DIR/critic/. The report says:

    rank, rollout_id (the update), step_id (the mini-batch), role, mode, time
    first_forward, first_backward     the sentinel's first non-finite module output / parameter gradient
    nonfinite_grads                   up to 20 parameters whose accumulated gradient is non-finite
    class, class_candidates, class_evidence   trace.sentinels.classify's class of cause
    loss_mode, inner_loss_mode        what the loss was (the bundle's replay needs it)
    rerun                             the verdict, once the rerun ran (added in place)
    bundle                            the bundle's path (None if not written)

The bundle (torch.save, tensors on the CPU; nanscope.trace.bundles.verl_bundle reads and replays it): FORMAT, the
report, the actor config's loss fields, and per micro-batch what the `nanscope` loss mode received ([B, T]
old_log_prob, log_prob, advantages, response_mask, rollout_is_weights), verl's normalisation numbers and the loss
the step's loss function returned: without that loss mode it holds the losses only. At most MAX_MICROBATCHES micro-batches: the sentinel's first,
then those whose loss was non-finite.
"""

from __future__ import annotations

import importlib.metadata
import time

import torch

from nanscope import __version__
from nanscope.slime_plugin.outputs import Reports, say, warn
from nanscope.slime_plugin.settings import Settings
from nanscope.trace.bundles.verl_bundle import FORMAT, plain_config

MAX_MICROBATCHES = 4


class Reporter:
    """Builds and writes this rank's reports (the files: `Reports`)."""

    def __init__(self, files: Reports, coords, settings: Settings, role: str):
        self.files, self.coords, self.settings, self.role = files, coords, settings, role
        self.config = None  # the step's actor config (the loss function's `keywords["config"]`), when it has one

    def write(self, reading, cls, *, calls: list, where: dict, names) -> str | None:
        """The report and bundle of this rank's non-finite reading; prints where they are. None: not written."""
        first_forward, first_backward = names.hit(reading.forward), names.hit(reading.backward)
        doc = {
            "rank": self.coords.rank,
            **where,
            "role": self.role,
            "mode": self.settings.on_nonfinite,
            "time": time.time(),
            "first_forward": first_forward.to_dict() if first_forward else None,
            "first_backward": first_backward.to_dict() if first_backward else None,
            "nonfinite_grads": [names.name(g) for g in reading.grads[:20]],
            "class": cls.cls,
            "class_candidates": list(cls.candidates),
            "class_evidence": cls.evidence,
            "loss_mode": plain_config(self.config).get("policy_loss", {}).get("loss_mode"),
            "inner_loss_mode": self.settings.inner_loss_mode,
        }
        bundle = self._bundle(doc, calls, reading)
        path = self.files.report(doc, where, bundle)
        # the bundle replays the actor's loss (trace/bundles/verl_bundle.py); the critic's value loss is not replayed
        offline = "to replay the loss offline" if self.role == "actor" else "to read its bundle offline"
        say(
            f"nanscope: rank {self.coords.rank}: non-finite values in the {self.role}'s update {where['rollout_id']} "
            f"mini-batch {where['step_id']}: {path or 'no report written'}; {offline}: "
            f"nanscope trace {self.files.stem(where)}.bundle.pt"
        )
        return path

    def _bundle(self, doc: dict, calls: list, reading) -> dict | None:
        try:
            return {
                "format": FORMAT,
                "nanscope": __version__,
                "verl": _verl_version(),
                "report": doc,
                "coords": self.coords.to_dict(),
                "config": plain_config(self.config),
                "microbatches": [_microbatch(c) for c in _kept(calls, reading)],
            }
        except Exception as e:  # nanscope's own failure: the report still goes out, the run goes on
            warn(f"rank {self.coords.rank}: could not build the repro bundle: {type(e).__name__}: {e}")
            return None


def _kept(calls: list, reading) -> list:
    """The sentinel's first micro-batch, then those whose loss was non-finite, at most MAX_MICROBATCHES."""
    first = {h.microbatch for h in (reading.forward, reading.backward) if h is not None}
    named = [c for c in calls if c.microbatch in first]
    bad = [c for c in calls if c not in named and c.loss is not None and not bool(torch.isfinite(c.loss))]
    return (named + bad)[:MAX_MICROBATCHES]


def _microbatch(call) -> dict:
    loss = None if call.loss is None else {"value": float(call.loss), "finite": bool(torch.isfinite(call.loss))}
    return {
        "microbatch": call.microbatch,
        "inputs": {k: v.detach().cpu() for k, v in call.inputs.items()},
        "batch": dict(call.batch),
        "loss": loss,
    }


def _verl_version() -> str | None:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None
