"""An always-on NaN/inf sentinel for training steps: on-device flags, one host sync per step.

Every module's call is followed by a check of its output: its float32 sum, written into the next slot
of a buffer on the output's device (one reduction kernel, `slots`; the check is a layer of the module's
call, `output_checks`). No check ever reads a value on the host. In backward a hook per parameter records
the order in which gradients arrive, and the tensors holding the accumulated gradients are screened once
before the step's first backward call and at the end of each (`grad_screens`). `read()` finds the first
non-finite slot on the device and copies it, with the gradient screens, to the host: ONE sync per step
(plus, only on a bad step, the exact per-parameter re-check). The slot index is the call order, so the
first non-finite module in forward order is recovered exactly, with its micro-batch; in backward, the
micro-batch exactly and the parameter by its arrival order within that micro-batch's backward call.

    sentinel = Sentinel(model_chunks)
    for step in ...:
        forward_backward(...)              # any number of micro-batches
        reading = sentinel.read(grads=True)  # Reading(forward=Hit|None, backward=Hit|None, grads=[...])
        if not reading.finite: write_report(reading)
    sentinel.remove()

Micro-batch index: the number of forward calls of the module's model chunk so far this step
(0-based); in backward, the micro-batch whose chunk output received its gradient at the start of the
call. Every check of a phase must be on one device (the buffer's).

With `output_grads=True` the gradient that arrives at each checked output in backward is checked too, so
a reading names the module whose own backward made the first non-finite gradient (`Reading.producer`).
"""

from __future__ import annotations

import math

import torch

from nanscope.trace.sentinels.expert_tokens import ExpertTokens
from nanscope.trace.sentinels.grad_screens import GradientScreens, check_grads, storage_norms
from nanscope.trace.sentinels.output_checks import OutputChecks, first_tensor
from nanscope.trace.sentinels.reading import Reading
from nanscope.trace.sentinels.slots import ALL_FINITE


class Sentinel:
    """Finiteness flags on every module output and parameter gradient of some model chunks.

    Args:
        modules: the model chunks (nn.Modules; megatron's list of virtual-pipeline chunks).
        params: also screen parameter gradients per backward call and name the first non-finite one in
            arrival order (see nanscope.trace.sentinels.grad_screens). Default True.
        include: `include(name, module) -> bool` selects the modules whose outputs are checked
            (default: all). Each check is one small kernel launch; on a model made of many tiny
            modules (e.g. MoE experts) `lambda n, m: ".local_experts." not in n` trims the count.
        output_grads: also check the gradient arriving at each checked module output (a tensor hook
            per module call: off by default for its cost), so a reading names the module whose own
            backward produced the first non-finite gradient (`Reading.producer`), not only the first
            parameter gradient it reached.
        experts: keep each MoE layer's per-expert token counts per micro-batch on the device
            (`trace.sentinels.expert_tokens`: one small reduction per router call); a non-finite step's reading carries
            the failing micro-batch's (`Reading.experts`), a healthy one's only how many were kept.
    """

    def __init__(self, modules, params: bool = True, include=None, output_grads: bool = False, experts: bool = True):
        self.roots = list(modules) if not isinstance(modules, torch.nn.Module) else [modules]
        self.step = 0
        self._experts = ExpertTokens(self.roots) if experts else None
        self._outputs = OutputChecks(len(self.roots), output_grads)
        self._gradients = GradientScreens()
        self._handles = []
        many = len(self.roots) > 1
        for chunk, root in enumerate(self.roots):
            prefix = f"chunk{chunk}." if many else ""
            self._handles.append(root.register_forward_pre_hook(self._outputs.chunk_starts(chunk)))
            self._handles.append(root.register_forward_hook(self._chunk_ends(chunk)))
            self._handles += self._outputs.install(root, chunk, prefix, include)
            self._handles += self._gradients.install(root, prefix, hooks=params)

    def _chunk_ends(self, chunk: int):
        """The forward hook of chunk `chunk`: when the gradient of its output arrives, a backward call of
        this micro-batch begins (no host sync)."""
        starts, backward_starts = self._outputs.starts[chunk], self._gradients.backward_starts

        def hook(module, args, output):
            mb = len(starts) - 1
            out = first_tensor(output)
            if out is not None and out.requires_grad:
                out.register_hook(lambda grad: backward_starts(mb))

        return hook

    # -- the one sync per step -------------------------------------------------------------
    def read(self, grads: bool = False) -> Reading:
        """Everything flagged since the last read, with ONE device-to-host copy (plus an exact re-check
        of each flagged accumulated gradient); starts a new step.

        Args:
            grads: also check every parameter's accumulated gradient (main_grad or .grad): one 2-norm per
                tensor holding them (megatron's flat grad buffers: one or two) in the same sync; per
                parameter, exactly, only when one of those is not finite.
        """
        values = self.pending(grads)
        return self.finish(values.tolist(), grads)  # the host sync

    def pending(self, grads: bool = False) -> torch.Tensor:
        """The step's flags as one float64 device tensor, not read: `read` in two halves, for a caller that
        copies them to the host together with its own numbers (the plugin's vote) and then calls `finish`.
        `nonfinite(values)` is its 0-dim "something is non-finite", on the device."""
        outputs, gradients = self._outputs, self._gradients
        gradients.screen_unended_call()
        parts = outputs.first_bad()
        screens = gradients.screens.values()
        norms = storage_norms(gradients.named_params) if grads else None
        found = (*parts, screens, norms)
        device = next((tensor.device for tensor in found if tensor is not None), torch.device("cpu"))
        none = torch.full((), ALL_FINITE, dtype=torch.float64, device=device)
        head = [(part if part is not None else none).to(device).reshape(1).double() for part in parts]
        tail = [tensor.to(device).double() for tensor in (screens, norms) if tensor is not None]
        return torch.cat(head + tail)

    @staticmethod
    def nonfinite(values: torch.Tensor) -> torch.Tensor:
        """0-dim bool on the device: `pending`'s values flag a non-finite output, output gradient, gradient
        screen or gradient norm (what `finish` turns into a reading that is not finite)."""
        return (values[:2] != ALL_FINITE).any() | ~torch.isfinite(values[2:]).all()

    def finish(self, values: list[float], grads: bool = False) -> Reading:
        """The reading from `pending`'s values, read to the host; starts a new step."""
        outputs, gradients = self._outputs, self._gradients
        screened = len(gradients.screens.labels)
        call = gradients.screens.first_bad(values[2 : 2 + screened])
        norms_ok = all(math.isfinite(value) for value in values[2 + screened :])
        flagged = check_grads(gradients.named_params) if call is not None or not norms_ok else []  # a bad step only
        reading = Reading(
            step=self.step,
            forward=outputs.forward_hit(int(values[0])),
            backward=gradients.backward_hit(call, flagged),
            grads=flagged if grads else [],
            producer=outputs.producer(int(values[1])),
        )
        if self._experts is not None and self._experts.layers:
            tokens = self._experts
            reading.experts = {"kept": tokens.kept} if reading.finite else tokens.read(reading.microbatch)
        self.reset()
        self.step += 1
        return reading

    def reset(self) -> None:
        """Drop this step's flags (call at step start if a step was abandoned without read())."""
        self._outputs.clear()
        self._gradients.clear()
        if self._experts is not None:
            self._experts.clear()

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._experts is not None:
            self._experts.remove()
