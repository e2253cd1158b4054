"""A non-finite step's report and repro bundle, written when the vote finds the step non-finite.

Written before the rerun, so an out-of-memory error or any exception during the rerun leaves them behind; the
rerun's verdict is added to the report afterwards (`Reporter.add_verdict`). The bundle is written once, with
the report as it stood then (`nanscope.trace.bundles.bundle`; `nanscope trace` reads it). What a report says:

    rank, rollout_id, step_id, mode, time
    first_forward, first_backward     the sentinel's first non-finite module output / parameter gradient
    nonfinite_grads                   up to 20 parameters whose accumulated gradient is non-finite
    expert_tokens                     the failing micro-batch's tokens per expert, and the zero-token finding
    replay                            how to rerun the step under the tracer on the cluster
    class, class_candidates, class_evidence   trace.sentinels.classify's class of cause
    rerun                             the verdict (verdict.Verdict.to_dict), once the rerun ran
    bundle, microbatch_file           the bundle's path (None if not written); bundle_left_out: why not
"""

from __future__ import annotations

import time

from nanscope.slime_plugin import bundles
from nanscope.slime_plugin.outputs import Reports, replay_instruction, say, warn


class Reporter:
    """Builds and writes this rank's reports (the files themselves: `outputs.Reports`)."""

    def __init__(self, files: Reports, coords, names, mode: str):
        self.files, self.coords, self.names, self.mode = files, coords, names, mode

    def write(self, reading, cls, *, seen: list, target, args, where: dict, rows) -> str | None:
        """The report (and bundle) of this rank's non-finite reading; prints where it is. None: not written.

        Args:
            cls: the reading's classification (trace.sentinels.classify), in public names.
            seen: the step's micro-batches as the loss saw them (loss_watch.Seen).
            rows: `rows(microbatch) -> (dump rows or None, how)` (slime_plugin.rows).
        """
        first_forward, first_backward = self.names.hit(reading.forward), self.names.hit(reading.backward)
        replay = replay_instruction(args, **where)
        doc = {
            "rank": self.coords.rank,
            **where,
            "mode": self.mode,
            "time": time.time(),
            "first_forward": first_forward.to_dict() if first_forward else None,
            "first_backward": first_backward.to_dict() if first_backward else None,
            "nonfinite_grads": [self.names.name(g) for g in reading.grads[:20]],
            "expert_tokens": reading.expert_tokens(self.names.offset),  # the failing micro-batch's tokens per expert
            "replay": replay,
            "class": cls.cls,
            "class_candidates": list(cls.candidates),
            "class_evidence": cls.evidence,
        }
        contents = self._bundle(reading, doc, seen=seen, target=target, args=args, where=where, rows=rows)
        path = self.files.report(doc, where, contents)
        offline = f"nanscope trace {self.files.dir}"
        say(
            f"nanscope: rank {self.coords.rank}: non-finite values at rollout {where['rollout_id']} step "
            f"{where['step_id']}: {path or 'no report written'}; to name the op offline: {offline}; "
            f"on the cluster: {replay['text']}"
        )
        return path

    def _bundle(self, reading, doc: dict, *, seen, target, args, where, rows) -> dict | None:
        """The bundle's contents (at most bundles.MAX_MICROBATCHES micro-batches); None if it cannot be built."""
        try:
            why, left_out = bundles.keep(bundles.reasons(reading, seen, self.coords.last_stage))
            if left_out:
                doc["bundle_microbatches_left_out"] = left_out
            return bundles.document(
                target=target, coords=self.coords, args=args, where=where, report=doc, seen=seen, why=why, rows=rows
            )
        except Exception as e:  # nanscope's own failure: the report still goes out, the run goes on
            warn(f"rank {self.coords.rank}: could not build the repro bundle: {type(e).__name__}: {e}")
            return None

    def add_verdict(self, path: str, verdict) -> None:
        """The rerun's verdict added to the report at `path` (rewritten in place; the bundle is not)."""
        self.files.add(path, rerun=verdict.to_dict())
