"""The sentinel's backward side: the order in which parameter gradients arrive, and a screen of the
accumulated gradients at the end of each backward call.

A tensor hook on every parameter records the order in which their gradients arrive (an int each, no
kernel), and the tensors holding the accumulated gradients (megatron's flat main_grad buffers, one or two
per chunk; else each .grad) are summed once before the step's first backward call and once at the end of
each (autograd's queue_callback: before megatron's data-parallel reduce, which runs after the call). The
first call whose screen turns non-finite is the micro-batch that made a gradient non-finite, exactly; on
that (bad) step read() re-checks each parameter's accumulated gradient and names the first non-finite one
in that call's arrival order. That names the parameter exactly unless a parameter that arrived earlier in
that call was made non-finite only by a later call of the step (or by a reduce). One flat sum per call
replaces a sum per parameter per micro-batch (about 95 per micro-batch for the tiny model): gradients that
were already non-finite before the step's first call (never zeroed) hide new ones (backward None;
read(grads=True) lists them). Fused weight-gradient kernels (TransformerEngine's
gradient_accumulation_fusion) write main_grad without calling parameter hooks: the screens still see
those (the reading then names the first non-finite parameter in parameter order).
"""

from __future__ import annotations

import math

import torch

from nanscope.trace.sentinels.reading import Hit

_grad_enabled, _set_grad_enabled = torch._C.is_grad_enabled, torch._C._set_grad_enabled
_sum, _F32 = torch.sum, torch.float32
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback  # runs when the backward call ends


def grad_of(param: torch.Tensor) -> torch.Tensor | None:
    """The accumulated gradient of a parameter: megatron DDP's main_grad if present, else .grad; this rank's
    shard where the gradient is a DTensor (FSDP2's `fully_shard`: a norm of the DTensor itself would be a collective
    the screen must not make)."""
    grad = getattr(param, "main_grad", None)
    grad = grad if grad is not None else param.grad
    return grad.to_local() if grad is not None and hasattr(grad, "to_local") else grad


def check_grads(named_params) -> list[str]:
    """Names of the parameters whose accumulated gradient is non-finite (one host sync when none is).

    Args:
        named_params: an nn.Module (its named_parameters()) or an iterable of (name, param).
    """
    items = named_params.named_parameters() if isinstance(named_params, torch.nn.Module) else named_params
    items_list = list(items)
    names, norms = _grad_norms(items_list)
    if norms is None:
        return []
    ok = torch.isfinite(norms).tolist()
    return _exactly_bad(dict(items_list), [name for name, good in zip(names, ok) if not good])


def _exactly_bad(params: dict, flagged: list[str]) -> list[str]:
    """Of the flagged parameters, those whose gradient really holds NaN/inf (not a norm overflow).
    Only runs, with its host syncs, when something was flagged."""
    return [name for name in flagged if not bool(torch.isfinite(grad_of(params[name])).all())]


def _grad_storages(items) -> list[torch.Tensor]:
    """Each tensor that holds accumulated gradients, once: a gradient's base when it is a view (megatron's
    DDP: every main_grad is a view into one flat buffer per dtype), else the gradient; detached."""
    storages = {}
    for _, param in items:
        grad = grad_of(param)
        if grad is not None:
            base = grad if grad._base is None else grad._base
            storages.setdefault(id(base), base)
    return [storage.detach() for storage in storages.values()]


def storage_norms(items) -> torch.Tensor | None:
    """2-norm [k] fp32 of each tensor that holds accumulated gradients, each once: a gradient's base when
    it is a view (megatron's DDP: every main_grad is a view into one flat buffer per dtype, so k is 1 or 2
    instead of one per parameter), else the gradient. A screen: finite norms mean every gradient is
    finite; a flagged one (which also covers a buffer's padding, or squares that overflow) sends the
    caller to the exact per-parameter check, `check_grads`. None when no parameter has a gradient."""
    storages = _grad_storages(items)
    if not storages:
        return None
    norms = torch._foreach_norm(storages, 2, dtype=torch.float32)
    device = norms[0].device
    return torch.stack([norm.to(device) for norm in norms])


def _grad_norms(items) -> tuple[list[str], torch.Tensor | None]:
    """(names, 2-norm of each accumulated gradient [n] fp32): one foreach kernel (on CPU 8x faster than
    the max-abs norm). NaN or inf when the gradient has such an entry; also inf when its squares
    overflow (entries near 1e19), so callers re-check flagged gradients exactly (`_exactly_bad`)."""
    names, grads = [], []
    for name, param in items:
        grad = grad_of(param)
        if grad is not None:
            names.append(name)
            grads.append(grad.detach())
    if not grads:
        return names, None
    device = grads[0].device
    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    return names, torch.stack([norm.to(device) for norm in norms])


class Screens:
    """Screens of the accumulated gradients, one per backward call: each tensor holding them (megatron's
    flat grad buffers: one or two per chunk; else each .grad) summed in float32 into the next slot of a
    device buffer, with the backward call it was taken after as its label (-1: before the step's first).
    All slots are read back at read(), in its one sync."""

    def __init__(self):
        self.labels: list[int] = []
        self._buffer: torch.Tensor | None = None

    def take(self, tensors: list[torch.Tensor], label: int) -> None:
        enabled = _grad_enabled()
        _set_grad_enabled(False)  # a double backward's .grad requires grad
        try:
            for tensor in tensors:
                slot = len(self.labels)
                if self._buffer is None or slot == self._buffer.numel():
                    self._grow(tensor.device)
                _sum(tensor, None, dtype=_F32, out=self._buffer[slot])
                self.labels.append(label)
        finally:
            _set_grad_enabled(enabled)

    def _grow(self, device: torch.device) -> None:
        old = self._buffer
        self._buffer = torch.empty(2 * old.numel() if old is not None else 64, dtype=_F32, device=device)
        if old is not None:
            self._buffer[: old.numel()].copy_(old)

    def values(self) -> torch.Tensor | None:
        return self._buffer[: len(self.labels)] if self.labels else None

    def first_bad(self, values: list[float]) -> int | None:
        """The first backward call whose screen is non-finite while the screen before it was finite (all
        finite before the step's first call when none was taken); None when there is none (also when the
        gradients were already non-finite before the step's first backward call)."""
        ok_before, i = True, 0
        while i < len(values):
            label, ok = self.labels[i], True
            while i < len(values) and self.labels[i] == label:
                ok = ok and math.isfinite(values[i])
                i += 1
            if not ok and ok_before and label >= 0:
                return label
            ok_before = ok
        return None

    def clear(self) -> None:
        self.labels.clear()


class GradientScreens:
    """The parameter gradients of a sentinel's model chunks: their arrival order (a hook per parameter),
    the backward calls (each begins when a chunk output's gradient arrives) and their screens."""

    def __init__(self):
        self.screens = Screens()
        self.named_params: list[tuple[str, torch.Tensor]] = []  # every parameter of the chunks
        self.hooked: list[tuple[str, str]] = []  # (module path, parameter name) per hooked parameter
        self.arrivals: list[int] = []  # per parameter gradient that arrived in backward: its index in hooked
        self.call_starts: list[int] = []  # per backward call (a chunk output's gradient arrived): arrivals so far
        self.call_microbatches: list[int] = []  # ... and its micro-batch
        self._screened = 0  # arrivals when the last screen was taken
        self._generation = 0  # clear() count: a screen queued before it is dropped

    def install(self, root: torch.nn.Module, prefix: str, hooks: bool) -> list:
        """Take chunk `root`'s parameters; with `hooks`, a hook on each that requires grad records its
        gradients' arrivals (the handles remove them)."""
        handles = []
        for name, param in root.named_parameters():
            self.named_params.append((prefix + name, param))
            if hooks and param.requires_grad:
                self.hooked.append(((prefix + name).rpartition(".")[0], prefix + name))
                handles.append(param.register_hook(self._grad_hook(len(self.hooked) - 1)))
        return handles

    def _grad_hook(self, index: int):
        arrivals = self.arrivals

        def hook(grad):  # the order only: the values are screened once per backward call
            arrivals.append(index)

        return hook

    def backward_starts(self, mb: int) -> None:
        """A backward call of micro-batch `mb` begins: the parameter gradients arriving from now on are its;
        the accumulated gradients are screened when it ends (and before the step's first call)."""
        self.call_starts.append(len(self.arrivals))
        self.call_microbatches.append(mb)
        if self.hooked:
            call, generation = len(self.call_starts) - 1, self._generation
            if call == 0:
                self._screen(-1)
            _queue_callback(lambda: self._screen(call, generation))

    def _screen(self, call: int, generation: int | None = None) -> None:
        if generation is not None and generation != self._generation:
            return  # the call ended after read()/reset(): it belongs to a step already read
        self.screens.take(_grad_storages(self.named_params), call)
        self._screened = len(self.arrivals)

    def screen_unended_call(self) -> None:
        """Screen a backward call that did not end (it raised), if gradients arrived since the last screen."""
        if len(self.arrivals) > self._screened:
            self._screen(max(len(self.call_starts) - 1, 0))

    def backward_hit(self, call: int | None, bad: list[str]) -> Hit | None:
        """The first parameter, in arrival order within backward call `call`, whose accumulated gradient is
        non-finite (`bad`); else the first of `bad` (a gradient written without its hook, e.g. by a fused
        weight-gradient kernel)."""
        if call is None or not bad:
            return None
        bad_set = set(bad)
        start = self.call_starts[call] if call < len(self.call_starts) else 0
        end = self.call_starts[call + 1] if call + 1 < len(self.call_starts) else len(self.arrivals)
        mb = self.call_microbatches[call] if call < len(self.call_microbatches) else 0
        for order in range(start, end):
            module, name = self.hooked[self.arrivals[order]]
            if name in bad_set:
                return Hit(module, mb, order, name)
        return Hit(bad[0].rpartition(".")[0], mb, start, bad[0])

    def clear(self) -> None:
        """Start a new step: a screen still queued by a call of this one is dropped."""
        self.screens.clear()
        self.arrivals.clear()
        self._screened = 0
        self._generation += 1
        self.call_starts.clear()
        self.call_microbatches.clear()
