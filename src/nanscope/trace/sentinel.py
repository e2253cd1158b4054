"""An always-on NaN/inf sentinel for training steps: on-device flags, one host sync per step.

Every module's call is followed by a check of its output: its float32 sum, written into the next slot
of a buffer on the output's device (one reduction kernel; NaN or +-inf iff some entry is, since NaN
and inf propagate through a sum). No check ever reads a value on the host. `read()` finds the first
non-finite slot on the device and copies it, with the gradient screens below, to the host: ONE sync per
step (plus, only on a bad step, the exact per-parameter re-check). A sum is 1 kernel where
isfinite(x).all() is 2 plus a bool tensor as large as x; the price is that finite entries summing beyond
the fp32 range (3.4e38) would be flagged, which no healthy activation or gradient comes near. The slot
index is the call order, so the first non-finite module in forward order is recovered exactly, with its
micro-batch.

Backward: a tensor hook on every parameter records the order in which their gradients arrive (an int
each, no kernel), and the tensors holding the accumulated gradients (megatron's flat main_grad buffers,
one or two per chunk; else each .grad) are summed once before the step's first backward call and once at
the end of each (autograd's queue_callback: before megatron's data-parallel reduce, which runs after the
call). The first call whose screen turns non-finite is the micro-batch that made a gradient non-finite,
exactly; on that (bad) step read() re-checks each parameter's accumulated gradient and names the first
non-finite one in that call's arrival order. That names the parameter exactly unless a parameter that
arrived earlier in that call was made non-finite only by a later call of the step (or by a reduce). One
flat sum per call replaces a sum per parameter per micro-batch (about 95 per micro-batch for the tiny
model): gradients that were already non-finite before the step's first call (never zeroed) hide new
ones (backward None; read(grads=True) lists them).

What a check costs, and why it is built this way (valgrind instruction counts, torch 2.13 CPU): the
sum into a slot is 12-15k instructions (dim=None: 1.2k fewer than dim=()), the same as a sum that returns
a new tensor or a foreach norm's share, but nothing is allocated, stacked or freed per check (stacking and
freeing 0-dim results cost ~5k more each). The output check is not a forward hook: a module with any hook
takes nn.Module's slow call path (hook dictionaries, backward-hook set-up, ~12k more per call). Instead
`module._call_impl`, which __call__ looks up on the instance, is a wrapper bound to the module
(`_CheckHandle`) that calls forward straight away when nn.Module's own `_call_impl` would (no hook on
the module or process-wide, no JIT trace; else `_call_impl` itself: forward and hooks) and checks the
output in the same frame.
A check therefore sees the output after every forward hook, also hooks registered after the sentinel,
e.g. a planted fault's (`megatron.faults`). A training forward's output is summed with grad mode
switched off around the one kernel rather than detached (cheaper). Per check the host keeps one int
(the index of its module) in a list; micro-batches are recovered at read() from where
each began. The tensor checked last is held (to skip wrappers that return it again, e.g. megatron's
MLP returning linear_fc2's output) until the end of its chunk's forward.

    sentinel = Sentinel(model_chunks)
    for step in ...:
        forward_backward(...)              # any number of micro-batches
        reading = sentinel.read(grads=True)  # Reading(forward=Hit|None, backward=Hit|None, grads=[...])
        if not reading.finite: write_report(reading)
    sentinel.remove()

Micro-batch index: the number of forward calls of the module's model chunk so far this step
(0-based); in backward, the micro-batch whose chunk output received its gradient at the start of the
call. Fused weight-gradient kernels (TransformerEngine's gradient_accumulation_fusion) write main_grad
without calling parameter hooks: the screens still see those (the reading then names the first
non-finite parameter in parameter order). Every check of a phase must be on one device (the buffer's).

With `output_grads=True` a tensor hook on each checked output also checks the gradient that arrives
there in backward (labelled with the output's forward micro-batch): the output-gradient check that ran
just before the first non-finite one, in the same micro-batch, was finite, so that module's own
backward made the value (`Reading.producer`). Off by default: a hook per module call.
"""

from __future__ import annotations

import bisect
import math
import types
from dataclasses import asdict, dataclass, field

import torch

_FOLD = 1024  # slots per phase before they are folded into a running first-index (bounds memory)
_NONE = 1 << 62  # "no non-finite call" as an index
_CHECKS = "_nanscope_checks"  # a checked module's instance attribute: the layers of its call (_CheckHandle)
_grad_enabled, _set_grad_enabled = torch._C.is_grad_enabled, torch._C._set_grad_enabled
_sum, _F32, _Tensor = torch.sum, torch.float32, torch.Tensor
# nn.Module._call_impl calls forward straight away when neither the module nor the process has a hook and no
# JIT trace runs; a wrapper takes the same shortcut (one frame less) and otherwise calls _call_impl itself.
_tracing = torch._C._get_tracing_state
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback  # runs when the backward call ends
_g_bwd_pre, _g_bwd, _g_fwd, _g_fwd_pre = (
    getattr(torch.nn.modules.module, f"_global_{kind}_hooks")
    for kind in ("backward_pre", "backward", "forward", "forward_pre")
)
_FLOATS = frozenset(t for t in vars(torch).values() if isinstance(t, torch.dtype) and t.is_floating_point)


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
    present, else .grad) is non-finite, when read(grads=True). producer: with output_grads=True."""

    step: int
    forward: Hit | None
    backward: Hit | None
    grads: list = field(default_factory=list)
    producer: Producer | None = None

    @property
    def finite(self) -> bool:
        return self.forward is None and self.backward is None and not self.grads and self.producer is None

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "finite": self.finite,
            "forward": None if self.forward is None else self.forward.to_dict(),
            "backward": None if self.backward is None else self.backward.to_dict(),
            "grads": list(self.grads),
            "producer": None if self.producer is None else self.producer.to_dict(),
        }


class _Phase:
    """Checks of one phase (module outputs, or the gradients arriving at them): float32 sums (finite iff
    the checked tensor is) written into slots of one device buffer, and per check a label of what was
    checked. The buffer is made at the first check and its 0-dim slot views as they are first needed, both
    kept across steps: in a steady state a check allocates nothing, and nothing is stacked or freed per
    check."""

    def __init__(self):
        self.labels: list = []  # per check, in call order: its module's index (output gradients: with the micro-batch)
        self.first: torch.Tensor | None = None  # running first bad index of folded flags (device)
        self.folded = 0
        self.pending = 0  # slots written since the last fold
        self._buffer: torch.Tensor | None = None  # [_FOLD] float32 on the device of the first check
        self._slots: list[torch.Tensor] = []  # 0-dim views of its first entries

    @property
    def count(self) -> int:
        """Checks made since the last clear."""
        return self.folded + self.pending

    def slot(self, device: torch.device) -> torch.Tensor:
        """The next free slot (the caller writes it and counts it: `pending += 1`)."""
        if self.pending == len(self._slots):
            self._make_room(device)
        return self._slots[self.pending]

    def add(self, x: torch.Tensor, label: int) -> None:
        """Check `x` (any float dtype): its float32 sum goes into the next slot; one kernel, outside
        autograd (an output of a training forward is summed with grad mode off, not detached: cheaper).
        The hooks inline this."""
        slot = self.slot(x.device)
        if x.requires_grad and _grad_enabled():
            _set_grad_enabled(False)
            try:
                _sum(x, None, dtype=_F32, out=slot)
            finally:
                _set_grad_enabled(True)
        else:
            _sum(x, None, dtype=_F32, out=slot)
        self.pending += 1
        self.labels.append(label)

    def add_total(self, total: torch.Tensor, label: int) -> None:
        """A float32 sum computed by the caller (several tensors of one module output)."""
        self.slot(total.device).copy_(total)
        self.pending += 1
        self.labels.append(label)

    def _make_room(self, device: torch.device) -> None:
        """The buffer at the first check, one more slot view while it has room, else a fold."""
        if self._buffer is None:
            self._buffer = torch.empty(_FOLD, dtype=torch.float32, device=device)
        if self.pending == self._buffer.numel():
            self.fold()
        else:
            self._slots.append(self._buffer[self.pending])

    def fold(self) -> None:
        """Reduce the pending slots on the device to the first bad index (no host sync)."""
        if not self.pending:
            return
        ok = torch.isfinite(self._buffer[: self.pending])
        index = torch.arange(self.folded, self.folded + self.pending, device=ok.device)
        first = torch.where(ok, _NONE, index).min()
        self.first = first if self.first is None else torch.minimum(self.first, first)
        self.folded += self.pending
        self.pending = 0

    def result(self) -> torch.Tensor | None:
        self.fold()
        return self.first

    def clear(self) -> None:
        """Start a new step (the buffer stays; the label list is cleared in place: the hooks hold it)."""
        self.labels.clear()
        self.first, self.folded, self.pending = None, 0, 0


def _scan(output) -> tuple[torch.Tensor | None, bool]:
    """(first tensor, whether it is the only float tensor) of a tuple/list module output, in one pass;
    (None, False) when it holds no tensor or is something else."""
    first, floats = None, 0
    if isinstance(output, (tuple, list)):
        for t in output:
            if isinstance(t, torch.Tensor):
                if first is None:
                    first = t
                floats += t.is_floating_point()
    return first, floats == 1 and first is not None and first.is_floating_point()


def _tuple_sum(output) -> torch.Tensor | None:
    """fp32 sum over the float tensors of a tuple/list module output: non-finite iff one of their entries
    is (see the module docstring); None when it holds none."""
    total = None
    if isinstance(output, (tuple, list)):
        for t in output:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                x = t.detach().sum(dtype=torch.float32)
                total = x if total is None else total + x
    return total


def _first_tensor(output) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((t for t in output if isinstance(t, torch.Tensor)), None)
    return None


def grad_of(param: torch.Tensor) -> torch.Tensor | None:
    """The accumulated gradient of a parameter: megatron DDP's main_grad if present, else .grad."""
    g = getattr(param, "main_grad", None)
    return g if g is not None else param.grad


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
    return _exactly_bad(dict(items_list), [n for n, good in zip(names, ok) if not good])


def _exactly_bad(params: dict, flagged: list[str]) -> list[str]:
    """Of the flagged parameters, those whose gradient really holds NaN/inf (not a norm overflow).
    Only runs, with its host syncs, when something was flagged."""
    return [n for n in flagged if not bool(torch.isfinite(grad_of(params[n])).all())]


def _grad_storages(items) -> list[torch.Tensor]:
    """Each tensor that holds accumulated gradients, once: a gradient's base when it is a view (megatron's
    DDP: every main_grad is a view into one flat buffer per dtype), else the gradient; detached."""
    storages = {}
    for _, p in items:
        g = grad_of(p)
        if g is not None:
            base = g if g._base is None else g._base
            storages.setdefault(id(base), base)
    return [t.detach() for t in storages.values()]


class _Screens:
    """Screens of the accumulated gradients, one per backward call: each tensor holding them (megatron's
    flat grad buffers: one or two per chunk; else each .grad) summed in float32 into the next slot of a
    device buffer, with the backward call it was taken after as its label (-1: before the step's first).
    All slots are read back at read(), in its one sync."""

    def __init__(self):
        self.labels: list[int] = []
        self._buffer: torch.Tensor | None = None

    def take(self, tensors: list[torch.Tensor], label: int) -> None:
        grad = _grad_enabled()
        _set_grad_enabled(False)  # a double backward's .grad requires grad
        try:
            for t in tensors:
                n = len(self.labels)
                if self._buffer is None or n == self._buffer.numel():
                    self._grow(t.device)
                _sum(t, None, dtype=_F32, out=self._buffer[n])
                self.labels.append(label)
        finally:
            _set_grad_enabled(grad)

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


def _storage_norms(items) -> torch.Tensor | None:
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
    return torch.stack([n.to(device) for n in norms])


def _grad_norms(items) -> tuple[list[str], torch.Tensor | None]:
    """(names, 2-norm of each accumulated gradient [n] fp32): one foreach kernel (on CPU 8x faster than
    the max-abs norm). NaN or inf when the gradient has such an entry; also inf when its squares
    overflow (entries near 1e19), so callers re-check flagged gradients exactly (`_exactly_bad`)."""
    names, grads = [], []
    for name, p in items:
        g = grad_of(p)
        if g is not None:
            names.append(name)
            grads.append(g.detach())
    if not grads:
        return names, None
    device = grads[0].device
    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    return names, torch.stack([n.to(device) for n in norms])


def _below(layers: list, wrapper):
    """The call that `wrapper` wraps: the layer installed before it (the first layer is the class's call)."""
    for i, layer in enumerate(layers):
        if layer.__func__ is wrapper:
            return layers[i - 1]
    raise AssertionError("wrapper not installed")


class _CheckHandle:
    """An output check installed as a layer of a module's call; `remove()` takes it off.

    A module's layers, in its instance state: its class's `_call_impl`, then one wrapper per sentinel, in
    install order, each bound to the module (deepcopy binds a copy's layers to the copy); the module's
    `_call_impl`, which `__call__` looks up on the instance, is the last. A wrapper calls the layer below
    it, then checks the output in the same frame.
    """

    def __init__(self, module: torch.nn.Module, wrapper):
        self.module, self.wrapper = module, wrapper
        state = module.__dict__
        layers = state.setdefault(_CHECKS, [types.MethodType(type(module)._call_impl, module)])
        layers.append(types.MethodType(wrapper, module))
        state["_call_impl"] = layers[-1]

    def remove(self) -> None:
        state = self.module.__dict__
        layers = [layer for layer in state.get(_CHECKS, []) if layer.__func__ is not self.wrapper]
        if len(layers) > 1:
            state[_CHECKS], state["_call_impl"] = layers, layers[-1]
        else:
            state.pop(_CHECKS, None)
            state.pop("_call_impl", None)


class Sentinel:
    """Finiteness flags on every module output and parameter gradient of some model chunks.

    Args:
        modules: the model chunks (nn.Modules; megatron's list of virtual-pipeline chunks).
        params: also screen parameter gradients per backward call and name the first non-finite one in
            arrival order (see the module docstring). Default True.
        include: `include(name, module) -> bool` selects the modules whose outputs are checked
            (default: all). Each check is one small kernel launch; on a model made of many tiny
            modules (e.g. MoE experts) `lambda n, m: ".local_experts." not in n` trims the count.
        output_grads: also check the gradient arriving at each checked module output (a tensor hook
            per module call: off by default for its cost), so a reading names the module whose own
            backward produced the first non-finite gradient (`Reading.producer`), not only the first
            parameter gradient it reached.
    """

    def __init__(self, modules, params: bool = True, include=None, output_grads: bool = False):
        self.roots = list(modules) if not isinstance(modules, torch.nn.Module) else [modules]
        self.step = 0
        self._fwd = _Phase()
        self._screens = _Screens()
        self._arrivals: list[int] = []  # per parameter gradient that arrived in backward: its index in _hooked
        self._screened = 0  # arrivals when the last screen was taken
        self._generation = 0  # reset() count: a screen queued before it is dropped
        self._ograd = _Phase()  # output_grads: labels are (module index, forward micro-batch)
        self._output_grads = output_grads
        self._checked: list[tuple[str, int]] = []  # (module path, chunk) per checked module: forward labels
        self._hooked: list[tuple[str, str]] = []  # (module path, parameter name) per hooked parameter
        self._starts: list[list[int]] = [[] for _ in self.roots]  # per chunk: forward checks made when each
        # of its micro-batches started (its micro-batch index = how many started so far)
        self._bwd_starts: list[int] = []  # per backward call (a chunk output's gradient arrived): arrivals so far
        self._bwd_mbs: list[int] = []  # ... and its micro-batch
        self._last = None  # the tensor checked last; let go at the end of each chunk's forward
        self._handles = []
        self._named_params: list[tuple[str, torch.Tensor]] = []
        many = len(self.roots) > 1
        for c, root in enumerate(self.roots):
            prefix = f"chunk{c}." if many else ""
            self._handles.append(root.register_forward_pre_hook(self._chunk_pre(c)))
            self._handles.append(root.register_forward_hook(self._chunk_post(c)))
            for name, m in root.named_modules():
                path = (prefix + name).rstrip(".")
                checked = include is None or include(path, m)
                if checked or m is root:
                    self._checked.append((path, c))
                    direct = type(m)._call_impl is torch.nn.Module._call_impl  # else its class's own call, always
                    check = self._output_check(len(self._checked) - 1, m is root, checked, direct)
                    self._handles.append(_CheckHandle(m, check))
            for name, p in root.named_parameters():
                self._named_params.append((prefix + name, p))
                if params and p.requires_grad:
                    self._hooked.append(((prefix + name).rpartition(".")[0], prefix + name))
                    self._handles.append(p.register_hook(self._grad_hook(len(self._hooked) - 1)))

    # -- hooks and checks (no host sync in any of them) ------------------------------------
    def _chunk_pre(self, c: int):
        starts, phase = self._starts[c], self._fwd

        def hook(module, args):
            starts.append(phase.count)

        return hook

    def _chunk_post(self, c: int):
        starts = self._starts[c]

        def hook(module, args, output):
            mb = len(starts) - 1
            out = _first_tensor(output)
            if out is not None and out.requires_grad:
                out.register_hook(lambda grad: self._backward_starts(mb))

        return hook

    def _backward_starts(self, mb: int) -> None:
        """A backward call of micro-batch `mb` begins: the parameter gradients arriving from now on are its;
        the accumulated gradients are screened when it ends (and before the step's first call)."""
        self._bwd_starts.append(len(self._arrivals))
        self._bwd_mbs.append(mb)
        if self._hooked:
            call, generation = len(self._bwd_starts) - 1, self._generation
            if call == 0:
                self._screen(-1)
            _queue_callback(lambda: self._screen(call, generation))

    def _screen(self, call: int, generation: int | None = None) -> None:
        if generation is not None and generation != self._generation:
            return  # the call ended after read()/reset(): it belongs to a step already read
        self._screens.take(_grad_storages(self._named_params), call)
        self._screened = len(self._arrivals)

    def _output_check(self, index: int, root: bool, checked: bool, direct: bool):
        """The wrapper of module `index`'s call that checks its output. A chunk's root is always wrapped:
        after the last check of the chunk's forward it lets go of the last checked tensor (`checked`:
        whether it checks too). `direct`: the module's class keeps nn.Module's call, whose shortcut to
        forward the wrapper may take."""
        phase, watch = self._fwd, self._output_grads
        labels, slots = phase.labels, phase._slots

        def call(module, *args, **kwargs):
            layers = module.__dict__[_CHECKS]
            if len(layers) > 2:  # another sentinel's wrapper below
                output = _below(layers, call)(*args, **kwargs)
            elif (not direct or module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                  or module._backward_pre_hooks or _g_fwd or _g_fwd_pre or _g_bwd or _g_bwd_pre or _tracing()):  # fmt: skip
                output = layers[0](*args, **kwargs)
            else:
                output = module.forward(*args, **kwargs)
            if isinstance(output, _Tensor):
                first = output
            elif type(output) is tuple and len(output) == 2 and output[1] is None:  # a linear's (out, None)
                first = output[0]
            else:
                first = None
            # Identity modules (IdentityOp, Dropout(p=0)) and wrappers that return their last child's
            # output (megatron's MLP returns linear_fc2's tensor): that tensor was just checked.
            if not checked:
                pass
            elif first is None:
                self._check_several(index, args, output)
            elif first is not self._last and not (args and first is args[0]) and first.dtype in _FLOATS:
                self._last = first
                if phase.pending == len(slots):
                    phase._make_room(first.device)
                slot = slots[phase.pending]
                if first.requires_grad and _grad_enabled():  # a training forward: sum outside autograd
                    _set_grad_enabled(False)
                    try:
                        _sum(first, None, dtype=_F32, out=slot)
                    finally:
                        _set_grad_enabled(True)
                else:
                    _sum(first, None, dtype=_F32, out=slot)
                phase.pending += 1
                labels.append(index)
                if watch:
                    self._watch_grad(first, index)
            if root:
                self._last = None
            return output

        return call

    def _check_several(self, index: int, args, output) -> None:
        """A tuple/list output other than (tensor, None): its only float tensor, or the sum of several."""
        first, alone = _scan(output)
        if first is None or first is self._last or (args and first is args[0]):
            return
        if alone:  # a tuple whose only float tensor is the first
            self._last = first
            self._fwd.add(first, index)
        else:
            total = _tuple_sum(output)
            if total is None:
                return
            self._last = first
            self._fwd.add_total(total, index)
        if self._output_grads:
            self._watch_grad(first, index)

    def _watch_grad(self, output: torch.Tensor, index: int) -> None:
        """output_grads: check the gradient that arrives at module `index`'s output, labelled with the
        output's forward micro-batch."""
        if output.requires_grad and _grad_enabled():
            label, phase = (index, len(self._starts[self._checked[index][1]]) - 1), self._ograd
            output.register_hook(lambda grad: phase.add(grad, label))

    def _grad_hook(self, index: int):
        arrivals = self._arrivals

        def hook(grad):  # the order only: the values are screened once per backward call
            arrivals.append(index)

        return hook

    def _forward_hit(self, index: int) -> Hit | None:
        if index >= _NONE:
            return None
        path, c = self._checked[self._fwd.labels[index]]
        return Hit(path, bisect.bisect_right(self._starts[c], index) - 1, index)

    def _backward_hit(self, call: int | None, bad: list[str]) -> Hit | None:
        """The first parameter, in arrival order within backward call `call`, whose accumulated gradient is
        non-finite (`bad`); else the first of `bad` (a gradient written without its hook, e.g. by a fused
        weight-gradient kernel)."""
        if call is None or not bad:
            return None
        bad_set = set(bad)
        start = self._bwd_starts[call] if call < len(self._bwd_starts) else 0
        end = self._bwd_starts[call + 1] if call + 1 < len(self._bwd_starts) else len(self._arrivals)
        mb = self._bwd_mbs[call] if call < len(self._bwd_mbs) else 0
        for order in range(start, end):
            module, name = self._hooked[self._arrivals[order]]
            if name in bad_set:
                return Hit(module, mb, order, name)
        return Hit(bad[0].rpartition(".")[0], mb, start, bad[0])

    def _producer(self, index: int) -> Producer | None:
        if index >= _NONE:
            return None
        labels = self._ograd.labels
        seen_at, mb = labels[index]
        before = labels[index - 1] if index else None
        module = self._checked[before[0]][0] if before is not None and before[1] == mb else None
        return Producer(module, self._checked[seen_at][0], mb, index)

    # -- the one sync per step -------------------------------------------------------------
    def read(self, grads: bool = False) -> Reading:
        """Everything flagged since the last read, with ONE device-to-host copy (plus an exact re-check
        of each flagged accumulated gradient); starts a new step.

        Args:
            grads: also check every parameter's accumulated gradient (main_grad or .grad): one 2-norm per
                tensor holding them (megatron's flat grad buffers: one or two) in the same sync; per
                parameter, exactly, only when one of those is not finite.
        """
        if len(self._arrivals) > self._screened:  # a backward call that did not end (it raised)
            self._screen(max(len(self._bwd_starts) - 1, 0))
        parts = [phase.result() for phase in (self._fwd, self._ograd)]
        screens = self._screens.values()
        norms = _storage_norms(self._named_params) if grads else None
        device = next((t.device for t in (*parts, screens, norms) if t is not None), torch.device("cpu"))
        none = torch.tensor(_NONE, device=device)
        head = [(p if p is not None else none).to(device).reshape(1).double() for p in parts]
        tail = [t.to(device).double() for t in (screens, norms) if t is not None]
        values = torch.cat(head + tail).tolist()  # the host sync
        n = len(self._screens.labels)
        call = self._screens.first_bad(values[2 : 2 + n])
        norms_ok = all(math.isfinite(v) for v in values[2 + n :])
        flagged = check_grads(self._named_params) if call is not None or not norms_ok else []  # a bad step only
        forward, backward = self._forward_hit(int(values[0])), self._backward_hit(call, flagged)
        reading = Reading(self.step, forward, backward, flagged if grads else [], self._producer(int(values[1])))
        self.reset()
        self.step += 1
        return reading

    def reset(self) -> None:
        """Drop this step's flags (call at step start if a step was abandoned without read())."""
        for phase in (self._fwd, self._ograd):
            phase.clear()
        self._screens.clear()
        self._arrivals.clear()
        self._screened = 0
        self._generation += 1
        for starts in self._starts:
            starts.clear()
        self._bwd_starts.clear()
        self._bwd_mbs.clear()
        self._last = None

    def remove(self) -> None:
        """Remove every hook."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
