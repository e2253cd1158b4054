"""The sentinel's forward side: a check of every module's output, in the module's own call, no host sync.

Each checked module's call is a wrapper (a layer of its call, `call_layers`) that calls forward straight
away when nn.Module's own `_call_impl` would (no hook on the module or process-wide, no JIT trace; else
`_call_impl` itself: forward and hooks) and writes the output's float32 sum into the next slot of the
forward `CheckSlots` in the same frame. A check therefore sees the output after every forward hook, also
hooks registered after the sentinel, e.g. a planted fault's (`megatron.faults`). A training forward's
output is summed with grad mode switched off around the one kernel rather than detached (cheaper). Per
check the host keeps one int (the index of its module) in a list; micro-batches are recovered at read()
from where each began (`starts`). The tensor checked last is held (to skip wrappers that return it again,
e.g. megatron's MLP returning linear_fc2's output) until the end of its chunk's forward.

What a check costs, and why it is built this way (valgrind instruction counts, torch 2.13 CPU): the
sum into a slot is 12-15k instructions (dim=None: 1.2k fewer than dim=()), the same as a sum that returns
a new tensor or a foreach norm's share, but nothing is allocated, stacked or freed per check (stacking and
freeing 0-dim results cost ~5k more each); a forward hook would cost ~12k more per call (call_layers).

With `watch_grads` a tensor hook on each checked output also checks the gradient that arrives there in
backward (labelled with the output's forward micro-batch): the output-gradient check that ran just before
the first non-finite one, in the same micro-batch, was finite, so that module's own backward made the
value (`Producer`). Off by default: a hook per module call.
"""

from __future__ import annotations

import bisect

import torch

from nanscope.trace.sentinels.call_layers import CHECKS, CheckHandle, below
from nanscope.trace.sentinels.reading import Hit, Producer
from nanscope.trace.sentinels.slots import ALL_FINITE, CheckSlots

_grad_enabled, _set_grad_enabled = torch._C.is_grad_enabled, torch._C._set_grad_enabled
_sum, _F32, _Tensor = torch.sum, torch.float32, torch.Tensor
# nn.Module._call_impl calls forward straight away when neither the module nor the process has a hook and no
# JIT trace runs; a wrapper takes the same shortcut (one frame less) and otherwise calls _call_impl itself.
_tracing = torch._C._get_tracing_state
_g_bwd_pre, _g_bwd, _g_fwd, _g_fwd_pre = (
    getattr(torch.nn.modules.module, f"_global_{kind}_hooks")
    for kind in ("backward_pre", "backward", "forward", "forward_pre")
)
_FLOATS = frozenset(t for t in vars(torch).values() if isinstance(t, torch.dtype) and t.is_floating_point)


def _scan(output) -> tuple[torch.Tensor | None, bool]:
    """(first tensor, whether it is the only float tensor) of a tuple/list module output, in one pass;
    (None, False) when it holds no tensor or is something else."""
    first, floats = None, 0
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                if first is None:
                    first = item
                floats += item.is_floating_point()
    return first, floats == 1 and first is not None and first.is_floating_point()


def _tuple_sum(output) -> torch.Tensor | None:
    """fp32 sum over the float tensors of a tuple/list module output: non-finite iff one of their entries
    is (see nanscope.trace.sentinels.slots); None when it holds none."""
    total = None
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                item_sum = item.detach().sum(dtype=torch.float32)
                total = item_sum if total is None else total + item_sum
    return total


def first_tensor(output) -> torch.Tensor | None:
    """A module output's tensor, or the first tensor of a tuple/list output (None: none)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((item for item in output if isinstance(item, torch.Tensor)), None)
    return None


class OutputChecks:
    """The module-output checks of a sentinel's model chunks (and with `watch_grads` the checks of the
    gradients arriving at those outputs), with what their labels mean: each checked module's path and
    chunk, and per chunk where each micro-batch's checks began."""

    def __init__(self, chunks: int, watch_grads: bool):
        self.forward = CheckSlots()  # labels: the checked module's index in `checked`
        self.output_grads = CheckSlots()  # watch_grads: labels are (module index, forward micro-batch)
        self.watch_grads = watch_grads
        self.checked: list[tuple[str, int]] = []  # (module path, chunk) per checked module: forward labels
        self.starts: list[list[int]] = [[] for _ in range(chunks)]  # per chunk: forward checks made when each
        # of its micro-batches started (its micro-batch index = how many started so far)
        self._last = None  # the tensor checked last; let go at the end of each chunk's forward

    def install(self, root: torch.nn.Module, chunk: int, prefix: str, include) -> list[CheckHandle]:
        """Wrap the call of every module of chunk `root` that `include(path, module)` selects (None: all),
        and of the root itself; the handles take the wrappers off."""
        handles = []
        for name, module in root.named_modules():
            path = (prefix + name).rstrip(".")
            checked = include is None or include(path, module)
            if checked or module is root:
                self.checked.append((path, chunk))
                direct = type(module)._call_impl is torch.nn.Module._call_impl  # else its class's own call, always
                check = self._output_check(len(self.checked) - 1, module is root, checked, direct)
                handles.append(CheckHandle(module, check))
        return handles

    def chunk_starts(self, chunk: int):
        """The forward pre-hook of chunk `chunk`: one of its micro-batches starts."""
        starts, phase = self.starts[chunk], self.forward

        def hook(module, args):
            starts.append(phase.count)

        return hook

    def _output_check(self, index: int, root: bool, checked: bool, direct: bool):
        """The wrapper of module `index`'s call that checks its output. A chunk's root is always wrapped:
        after the last check of the chunk's forward it lets go of the last checked tensor (`checked`:
        whether it checks too). `direct`: the module's class keeps nn.Module's call, whose shortcut to
        forward the wrapper may take."""
        phase, watch = self.forward, self.watch_grads
        labels, slots = phase.labels, phase.slots

        def call(module, *args, **kwargs):
            layers = module.__dict__[CHECKS]
            if len(layers) > 2:  # another sentinel's wrapper below
                output = below(layers, call)(*args, **kwargs)
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
                    phase.make_room(first.device)
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
            self.forward.add(first, index)
        else:
            total = _tuple_sum(output)
            if total is None:
                return
            self._last = first
            self.forward.add_total(total, index)
        if self.watch_grads:
            self._watch_grad(first, index)

    def _watch_grad(self, output: torch.Tensor, index: int) -> None:
        """watch_grads: check the gradient that arrives at module `index`'s output, labelled with the
        output's forward micro-batch."""
        if output.requires_grad and _grad_enabled():
            label, phase = (index, len(self.starts[self.checked[index][1]]) - 1), self.output_grads
            output.register_hook(lambda grad: phase.add(grad, label))

    def first_bad(self) -> list[torch.Tensor | None]:
        """[first non-finite forward check, first non-finite output-gradient check] on the device
        (ALL_FINITE: none; None: no check made)."""
        return [phase.result() for phase in (self.forward, self.output_grads)]

    def forward_hit(self, index: int) -> Hit | None:
        """The module of forward check `index` and its micro-batch (None for ALL_FINITE)."""
        if index >= ALL_FINITE:
            return None
        path, chunk = self.checked[self.forward.labels[index]]
        return Hit(path, bisect.bisect_right(self.starts[chunk], index) - 1, index)

    def producer(self, index: int) -> Producer | None:
        """The module whose backward made output-gradient check `index` non-finite (None for ALL_FINITE)."""
        if index >= ALL_FINITE:
            return None
        labels = self.output_grads.labels
        seen_at, mb = labels[index]
        before = labels[index - 1] if index else None
        module = self.checked[before[0]][0] if before is not None and before[1] == mb else None
        return Producer(module, self.checked[seen_at][0], mb, index)

    def clear(self) -> None:
        """Start a new step: drop the flags, the micro-batch starts and the last checked tensor."""
        for phase in (self.forward, self.output_grads):
            phase.clear()
        for starts in self.starts:
            starts.clear()
        self._last = None
