"""The plugin's before-train-step hook: an always-on sentinel, reports, skip mode.

    --custom-megatron-before-train-step-hook-path nanscope.slime_plugin.before_train_step
"""

from __future__ import annotations

import os

from nanscope.slime_plugin.loss import _step_microbatches

ON_NONFINITE = ("raise", "skip")


class _Guard:
    """Per-process state of the hook: the sentinel on the model chunks and this step's bookkeeping."""

    def __init__(self, chunks, optimizer):
        from nanscope.trace import Sentinel

        self.chunks, self.optimizer = chunks, optimizer
        self.sentinel = Sentinel(chunks)
        self.where: dict = {}
        self.checked = False  # the sentinel was read in this step's finalize
        self.skip_step = False
        self.skipped = 0
        self.reports: list[str] = []
        self.inputs: list = []  # this step's micro-batches as the first chunk received them (input_ids)
        chunks[0].register_forward_pre_hook(self._record_inputs, with_kwargs=True)
        for chunk in chunks:  # finalize_model_grads -> chunk.finish_grad_sync(): read the sentinel first
            chunk.finish_grad_sync = self._before(chunk.finish_grad_sync)
        optimizer.step = self._optimizer_step(optimizer.step)

    def _record_inputs(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and module.training:
            self.inputs.append(ids)

    def _before(self, finish_grad_sync):
        def wrapped(*args, **kwargs):
            if not self.checked:
                self.checked = True
                self.check()
            return finish_grad_sync(*args, **kwargs)

        return wrapped

    def _optimizer_step(self, step):
        def wrapped(*args, **kwargs):
            if self.skip_step:  # the step's gradients were non-finite and zeroed: no update at all
                self.skip_step = False
                return True, 0.0, None
            return step(*args, **kwargs)

        return wrapped

    def check(self) -> None:
        """At the end of the backward pass, before Megatron's own check: one host sync."""
        import torch
        import torch.distributed as dist

        reading = self.sentinel.read(grads=True)
        mode = os.environ.get("NANSCOPE_ON_NONFINITE", "raise")
        if mode not in ON_NONFINITE:
            raise ValueError(f"NANSCOPE_ON_NONFINITE={mode!r}: expected one of {', '.join(ON_NONFINITE)}")
        bad = not reading.finite
        if not bad and mode == "raise":
            return
        if bad:
            self.reports.append(self.write_report(reading, mode))
        if mode == "skip":
            # Every rank must agree to skip, or the replicas' parameters would diverge.
            flag = torch.tensor([1.0 if bad else 0.0])
            if dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                for chunk in self.chunks:
                    chunk.zero_grad_buffer()
                self.skip_step = True
                self.skipped += 1
                print(f"nanscope: non-finite gradients at rollout {self.where.get('rollout_id')} step "
                      f"{self.where.get('step_id')}: step skipped ({self.skipped} so far)", flush=True)

    def write_report(self, reading, mode: str) -> str:
        """NANSCOPE_REPORT_DIR/rollout<R>_step<S>_rank<K>.json, plus the micro-batch (.pt, weights_only)."""
        import json
        import time

        import torch
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        out = os.environ.get("NANSCOPE_REPORT_DIR", "nanscope_reports")
        os.makedirs(out, exist_ok=True)
        stem = os.path.join(out, f"rollout{self.where.get('rollout_id')}_step{self.where.get('step_id')}_rank{rank}")
        hit = reading.forward or reading.backward
        dump = None
        if hit is not None and hit.microbatch < len(self.inputs):
            # The micro-batch to replay: its packed tokens as the model received them, and slime's
            # micro-batch dict (log-probs, advantages, masks) when the nanscope loss saw it.
            dump = stem + ".pt"
            batch = _step_microbatches[hit.microbatch] if hit.microbatch < len(_step_microbatches) else None
            cpu = None
            if batch is not None:
                cpu = {k: [torch.as_tensor(x).detach().cpu() for x in v] if isinstance(v, list) else v
                       for k, v in batch.items() if k != "packed_seq_params"}
            torch.save({"rollout_id": self.where.get("rollout_id"), "step_id": self.where.get("step_id"), "rank": rank,
                        "microbatch": hit.microbatch, "input_ids": self.inputs[hit.microbatch].detach().cpu(),
                        "batch": cpu}, dump)
        doc = {
            "rank": rank,
            **self.where,
            "mode": mode,
            "time": time.time(),
            "first_forward": reading.forward.to_dict() if reading.forward else None,
            "first_backward": reading.backward.to_dict() if reading.backward else None,
            "nonfinite_grads": reading.grads[:20],
            "microbatch_file": dump,
        }
        with open(stem + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        return stem + ".json"


_guard: _Guard | None = None


def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """slime's --custom-megatron-before-train-step-hook-path entry point.

    Installs (once) an always-on sentinel on the model chunks: per-module output and per-parameter
    gradient finiteness flags kept on device, read once per step just before Megatron's DDP
    gradient check. On a non-finite step it writes a report (rank, rollout, step, micro-batch, first
    module in forward and in backward order) to NANSCOPE_REPORT_DIR and saves that micro-batch
    (its input_ids, plus slime's micro-batch dict when the nanscope loss saw it). With
    NANSCOPE_ON_NONFINITE=skip the step's gradients are zeroed and the optimizer step skipped on
    every rank, instead of letting Megatron's check kill the job.
    """
    global _guard
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if _guard is None or _guard.chunks != chunks:
        _guard = _Guard(chunks, optimizer)
    _guard.sentinel.reset()
    _guard.checked = False
    _guard.where = {"rollout_id": rollout_id, "step_id": step_id}
    _guard.inputs.clear()
    _step_microbatches.clear()


def skipped_steps() -> int:
    """Steps the hook skipped in this process (NANSCOPE_ON_NONFINITE=skip)."""
    return _guard.skipped if _guard is not None else 0


def reports() -> list[str]:
    """Report files the hook wrote in this process."""
    return list(_guard.reports) if _guard is not None else []
