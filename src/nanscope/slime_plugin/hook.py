"""The plugin's before-train-step hook: an always-on sentinel, reports, skip mode, one traced step.

    --custom-megatron-before-train-step-hook-path nanscope.slime_plugin.before_train_step

Environment, read when the hook installs (the first training step); a bad value raises there, an
empty one counts as unset:
    NANSCOPE_REPORT_DIR    where reports go (default ./nanscope_reports)
    NANSCOPE_ON_NONFINITE  raise (default): Megatron's check ends the step, as without nanscope
                           | skip: zero the step's gradients on every rank, skip the optimizer and
                           learning-rate steps; optimizer.step returns grad norm NaN, as slime's own
                           check_for_nan_in_loss_and_grad=False path treats an invalid step
    NANSCOPE_MAX_SKIPS     K >= 1: with skip, end the run with an error when K steps in a row were skipped
                           (ignored with raise)
    NANSCOPE_TRACE_STEP    R:S: run rollout R's step S under the op tracer (nanscope.trace.step) on every
                           rank and write which op first made a non-finite value, its module, source
                           line, sample and response token

On a non-finite step every rank with a non-finite value writes `rollout<R>_step<S>_rank<K>.json` (the
first module in forward and backward order, its micro-batch, and the `replay` instruction: the same
NANSCOPE_TRACE_STEP on every rank) and `.pt` (that micro-batch's input_ids). A traced step writes
`rollout<R>_step<S>_rank<K>.trace.json` with this rank's trace and `first`, the first producer over
all ranks.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from nanscope.slime_plugin.loss import _step_microbatches

ON_NONFINITE = ("raise", "skip")
_MISSING = object()


@dataclass(frozen=True)
class Settings:
    """The hook's environment variables, validated."""

    report_dir: str = "nanscope_reports"
    on_nonfinite: str = "raise"
    max_skips: int | None = None
    trace_step: tuple[int, int] | None = None

    @classmethod
    def from_env(cls, env=os.environ) -> Settings:
        mode = env.get("NANSCOPE_ON_NONFINITE") or "raise"
        if mode not in ON_NONFINITE:
            raise ValueError(f"NANSCOPE_ON_NONFINITE={mode!r}: expected one of {', '.join(ON_NONFINITE)}")
        max_skips = env.get("NANSCOPE_MAX_SKIPS") or None
        if max_skips is not None and not (max_skips.isdigit() and int(max_skips) >= 1):
            raise ValueError(f"NANSCOPE_MAX_SKIPS={max_skips!r}: expected an integer >= 1")
        step = env.get("NANSCOPE_TRACE_STEP") or None
        parts = (step or "").split(":")
        if step is not None and not (len(parts) == 2 and all(p.isdigit() for p in parts)):
            raise ValueError(f"NANSCOPE_TRACE_STEP={step!r}: expected ROLLOUT:STEP, e.g. 12:0")
        return cls(
            env.get("NANSCOPE_REPORT_DIR") or cls.report_dir,
            mode,
            int(max_skips) if max_skips else None,
            (int(parts[0]), int(parts[1])) if step is not None else None,
        )


def replay_instruction(args, rollout_id, step_id) -> dict:
    """How to rerun a step under the tracer: one env var plus slime's --load-debug-rollout-data."""
    saved = getattr(args, "save_debug_rollout_data", None) or getattr(args, "load_debug_rollout_data", None)
    data = saved or "<the --save-debug-rollout-data path; this run saved no rollouts>"
    return {
        "NANSCOPE_TRACE_STEP": f"{rollout_id}:{step_id}",
        "load_debug_rollout_data": saved,
        "text": f"rerun from the checkpoint before rollout {rollout_id} with NANSCOPE_TRACE_STEP={rollout_id}:"
        f"{step_id} in the environment and --load-debug-rollout-data {data}",
    }


def _coords() -> dict:
    """This rank's place: global rank, pipeline stage, tensor-parallel and context-parallel ranks."""
    import torch.distributed as dist

    out = {
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "pp": 0,
        "tp": 0,
        "cp_rank": 0,
        "cp_size": 1,
        "logs": True,
        "last_stage": True,
    }
    try:
        from megatron.core import parallel_state as mpu
    except ImportError:
        return out
    if mpu.model_parallel_is_initialized():
        pp, last = mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size() - 1
        out.update(
            pp=pp,
            tp=mpu.get_tensor_model_parallel_rank(),
            cp_rank=mpu.get_context_parallel_rank(),
            cp_size=mpu.get_context_parallel_world_size(),
        )
        # the rank slime logs from: data-parallel (with CP) rank 0, TP rank 0, last pipeline stage
        out["logs"] = mpu.get_data_parallel_rank(with_context_parallel=True) == 0 and out["tp"] == 0 and pp == last
        out["last_stage"] = pp == last
    return out


def _layer_offset(chunks) -> int:
    """The global index of the first chunk's first decoder layer (megatron's layer_number is 1-based and
    global; module paths number a stage's layers from 0)."""
    for m in chunks[0].modules():
        if isinstance(getattr(m, "layer_number", None), int):
            return m.layer_number - 1
    return 0


class _Guard:
    """The hook installed on some model chunks and their optimizer: sentinel, wrappers, per-step state."""

    def __init__(self, chunks, optimizer, scheduler, settings: Settings):
        from nanscope.trace import Sentinel

        self.chunks, self.optimizer, self.scheduler, self.settings = chunks, optimizer, scheduler, settings
        self.coords = _coords()
        self.sentinel = Sentinel(chunks)
        self.skipped = self.in_a_row = 0
        self.reports: list[str] = []
        self.logged: list[dict] = []
        self.inputs: list = []  # this step's micro-batches as the first chunk received them (input_ids)
        self.trace = None  # a StepTrace while NANSCOPE_TRACE_STEP's step runs
        self.args, self.where = None, {}
        self.checked = self.skip_step = self.skipped_now = False
        self.out_grads: list = []  # this step's: the gradient arriving at a chunk's output is finite (0-dim, on device)
        self._handles = [chunks[0].register_forward_pre_hook(self._record_inputs, with_kwargs=True)]
        self._handles += [chunk.register_forward_hook(self._watch_output) for chunk in chunks]
        self._wrapped: list[tuple] = []  # (object, attribute, its previous instance value, our wrapper)
        for chunk in chunks:  # finalize_model_grads -> chunk.finish_grad_sync(): read the sentinel first
            self._wrap(chunk, "finish_grad_sync", self._before)
        self._wrap(optimizer, "step", self._optimizer_step)
        if scheduler is not None:
            self._wrap(scheduler, "step", self._scheduler_step)

    def _wrap(self, obj, name: str, make) -> None:
        previous = vars(obj).get(name, _MISSING)
        wrapper = make(getattr(obj, name))
        setattr(obj, name, wrapper)
        self._wrapped.append((obj, name, previous, wrapper))

    def remove(self) -> None:
        """Remove every hook and put back what was wrapped (unless someone wrapped it again since)."""
        if self.trace is not None:
            self.trace.stop()
            self.trace = None
        self.sentinel.remove()
        for h in self._handles:
            h.remove()
        for obj, name, previous, wrapper in reversed(self._wrapped):
            if vars(obj).get(name) is wrapper:
                delattr(obj, name) if previous is _MISSING else setattr(obj, name, previous)
        self._wrapped.clear()

    # -- per step ----------------------------------------------------------------------------
    def begin(self, args, rollout_id, step_id) -> None:
        """Start of a step: fresh flags; the tracer when NANSCOPE_TRACE_STEP names this step."""
        from nanscope.trace.step import StepTrace, load_rollout

        if self.trace is not None:  # the traced step ended before its backward (an exception)
            self.trace.stop()
            self.trace = None
        self.sentinel.reset()
        self.args, self.where = args, {"rollout_id": rollout_id, "step_id": step_id}
        self.checked = self.skip_step = self.skipped_now = False
        self.inputs.clear()
        self.out_grads.clear()
        _step_microbatches.clear()
        if self.settings.trace_step == (rollout_id, step_id):
            path = getattr(args, "load_debug_rollout_data", None)
            rollout = load_rollout(path.format(rollout_id=rollout_id)) if path else None
            self.trace = StepTrace(self.chunks, rollout, self.coords["cp_rank"], self.coords["cp_size"])
            self.trace.start()

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
            if self.skip_step:  # gradients zeroed: no update; a NaN grad norm says "not a real step"
                self.skip_step, self.skipped_now = False, True
                return True, float("nan"), None
            return step(*args, **kwargs)

        return wrapped

    def _scheduler_step(self, step):
        def wrapped(*args, **kwargs):
            if self.skipped_now:  # a skipped step does not advance the learning-rate schedule
                return None
            return step(*args, **kwargs)

        return wrapped

    def check(self) -> None:
        """At the end of the backward pass, before Megatron's own check: one host sync (plus, in skip
        mode, one all-reduce; on the traced step, one all-gather)."""
        reading = self.sentinel.read(grads=True)
        if not reading.finite:
            self.reports.append(self.write_report(reading))
        if self.trace is not None:
            self.reports.append(self.write_trace())
        if self.settings.on_nonfinite == "skip":
            self.skip(not reading.finite)

    def skip(self, bad: bool) -> None:
        """Every rank agrees (all-reduce MAX) to skip, or the replicas' parameters would diverge."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if bad else 0.0])
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            for chunk in self.chunks:
                chunk.zero_grad_buffer()
            self.skip_step = True
            self.skipped, self.in_a_row = self.skipped + 1, self.in_a_row + 1
        else:
            self.in_a_row = 0
        self.log({"nanscope/skipped_steps": self.skipped})
        limit = self.settings.max_skips
        if limit is not None and self.in_a_row >= limit:
            raise RuntimeError(
                f"nanscope: {self.in_a_row} step(s) in a row had non-finite gradients (the last: rollout "
                f"{self.where['rollout_id']} step {self.where['step_id']}); NANSCOPE_MAX_SKIPS={limit}: stopping "
                f"the run. Reports: {os.path.abspath(self.settings.report_dir)}"
            )

    def log(self, metrics: dict) -> None:
        """On the rank slime logs from: print as slime does, and to wandb when slime uses it."""
        if not self.coords["logs"]:
            return
        self.logged.append({**self.where, **metrics})
        print(f"nanscope: rollout {self.where['rollout_id']} step {self.where['step_id']}: {metrics}", flush=True)
        if getattr(self.args, "use_wandb", False):
            import wandb

            wandb.define_metric("nanscope/*", step_metric="train/step")
            steps = self.args.rollout_batch_size * self.args.n_samples_per_prompt // self.args.global_batch_size
            wandb.log({**metrics, "train/step": self.where["rollout_id"] * steps + self.where["step_id"]})

    # -- files -------------------------------------------------------------------------------
    def _stem(self) -> str:
        os.makedirs(self.settings.report_dir, exist_ok=True)
        w = self.where
        name = f"rollout{w['rollout_id']}_step{w['step_id']}_rank{self.coords['rank']}"
        return os.path.join(self.settings.report_dir, name)

    def write_report(self, reading) -> str:
        """`<stem>.json`: where the step went non-finite and how to replay it; `<stem>.pt`: that micro-batch."""
        import torch

        from nanscope.trace.replay import SENTINEL_FORMAT

        stem, rank = self._stem(), self.coords["rank"]
        hit = reading.forward or reading.backward
        dump = None
        if hit is not None and hit.microbatch < len(self.inputs):
            dump = stem + ".pt"
            batch = _step_microbatches[hit.microbatch] if hit.microbatch < len(_step_microbatches) else None
            cpu = None
            if batch is not None:  # slime's micro-batch dict, when the nanscope loss saw it
                cpu = {
                    k: [torch.as_tensor(x).detach().cpu() for x in v] if isinstance(v, list) else v
                    for k, v in batch.items()
                    if k != "packed_seq_params"
                }
            torch.save(
                {
                    "format": SENTINEL_FORMAT,
                    **self.where,
                    "rank": rank,
                    "microbatch": hit.microbatch,
                    "input_ids": self.inputs[hit.microbatch].detach().cpu(),
                    "batch": cpu,
                },
                dump,
            )
        replay = replay_instruction(self.args, **self.where)
        cls = self.classify(reading)
        doc = {
            "rank": rank,
            **self.where,
            "mode": self.settings.on_nonfinite,
            "time": time.time(),
            "first_forward": reading.forward.to_dict() if reading.forward else None,
            "first_backward": reading.backward.to_dict() if reading.backward else None,
            "nonfinite_grads": reading.grads[:20],
            "microbatch_file": dump,
            "replay": replay,
            "class": cls.cls,
            "class_candidates": list(cls.candidates),
            "class_evidence": cls.evidence,
        }
        with open(stem + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        print(
            f"nanscope: rank {rank}: non-finite values at rollout {self.where['rollout_id']} step "
            f"{self.where['step_id']}: {stem}.json; to name the op: {replay['text']}",
            flush=True,
        )
        return stem + ".json"

    def _watch_output(self, module, args, output):
        """The class needs to know whether the gradient entering the chunk (from the loss or the next
        stage) was already non-finite: one reduction per micro-batch, no host sync."""
        import torch

        out = output[0] if isinstance(output, (tuple, list)) else output
        if module.training and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: self.out_grads.append(torch.isfinite(g).all()))

    def classify(self, reading):
        """The reading's class of cause (trace.classify); the loss inputs are those the nanscope loss saw."""
        import torch

        from nanscope.trace.classify import Observation, classify

        inputs = None
        if self.coords["last_stage"] and _step_microbatches:
            keys = ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages")
            xs = {k: [torch.as_tensor(x) for mb in _step_microbatches for x in mb.get(k) or []] for k in keys}
            inputs = {
                k: (sum(int((~torch.isfinite(x)).sum()) for x in v), sum(x.numel() for x in v))
                for k, v in xs.items()
                if v
            }
        entering = all(bool(g) for g in self.out_grads) if self.out_grads else None
        return classify(
            Observation(
                reading.forward,
                reading.backward,
                tuple(reading.grads),
                inputs,
                entering,
                self.coords["last_stage"],
                layer_offset=_layer_offset(self.chunks),
            )
        )

    def write_trace(self) -> str:
        """`<stem>.trace.json`: this rank's trace and the first producer over all ranks (an all-gather)."""
        import torch.distributed as dist

        from nanscope.report import trace as render
        from nanscope.trace.step import first_across_ranks

        own = self.trace.stop().to_dict()
        mine = {"rank": self.coords["rank"], "pp": self.coords["pp"], "tp": self.coords["tp"], "trace": own}
        records = [mine]
        if dist.is_initialized():
            records = [None] * dist.get_world_size()
            dist.all_gather_object(records, mine)
        first = first_across_ranks(records)
        doc = {
            **mine,
            **self.where,
            "microbatch_samples": self.trace.microbatches,
            "rollout_data": getattr(self.args, "load_debug_rollout_data", None),
            "first": first,
        }
        self.trace = None
        path = self._stem() + ".trace.json"
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        if self.coords["rank"] == 0:
            head = f"nanscope trace of rollout {self.where['rollout_id']} step {self.where['step_id']} (all ranks):"
            print("\n".join([head] + ["  " + line for line in render.first_lines(first)]), flush=True)
        return path


_guard: _Guard | None = None


def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """slime's --custom-megatron-before-train-step-hook-path entry point.

    Installs an always-on sentinel on the model chunks (once: a new list of chunks or a new optimizer
    replaces the old installation): per-module output finiteness flags and a screen of the gradient
    buffers after each backward call, kept on device, read once per step just before Megatron's DDP gradient check. On a non-finite step it
    writes a report to NANSCOPE_REPORT_DIR (see the module docstring); with NANSCOPE_ON_NONFINITE=skip
    the step's gradients are zeroed and its optimizer step skipped on every rank.
    """
    global _guard
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if (
        _guard is None
        or _guard.chunks != chunks
        or _guard.optimizer is not optimizer
        or _guard.scheduler is not opt_param_scheduler
    ):
        uninstall()
        _guard = _Guard(chunks, optimizer, opt_param_scheduler, Settings.from_env())
    _guard.begin(args, rollout_id, step_id)


def uninstall() -> None:
    """Remove the hook from the model chunks and the optimizer (and scheduler), restoring them."""
    global _guard
    if _guard is not None:
        _guard.remove()
        _guard = None


def skipped_steps() -> int:
    """Steps the hook skipped in this process (NANSCOPE_ON_NONFINITE=skip)."""
    return _guard.skipped if _guard is not None else 0


def reports() -> list[str]:
    """Files the hook wrote in this process: reports (.json) and traces (.trace.json)."""
    return list(_guard.reports) if _guard is not None else []


def logged() -> list[dict]:
    """What the hook logged on this rank (skip mode), one dict per step: rollout_id, step_id, metrics."""
    return list(_guard.logged) if _guard is not None else []
