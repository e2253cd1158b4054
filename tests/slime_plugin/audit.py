"""What a healthy step costs the host and the memory, counted at dispatch: the no-harm audit's instrument.

    with Audit() as audit:
        train_one_step(...)
    audit.syncs            Counter: (owner, what) -> count, owner "plugin" or "run"
    audit.largest          {"plugin": (bytes, op), "run": (bytes, op)}: the largest tensor each allocated

What forces a CUDA host sync (a CPU run makes none, so each is counted where it would):

    at dispatch     aten._local_scalar_dense (.item(), bool(t), int(t), float(t), x[t] with a 0-dim index),
                    aten.nonzero, aten.masked_select, indexing with a boolean mask (aten.index.Tensor), and a copy
                    from a non-CPU device to the CPU (none on CPU)
    Python level    Tensor.tolist() (CPU does not dispatch it), torch.tensor(data, device=...) and
                    Tensor.new_tensor(data) from Python values (a host-to-device copy the host waits for)

Each op or call is the plugin's when the innermost frame of nanscope's or megatron's code that issued it is the
plugin's (nanscope.slime_plugin, nanscope.trace: the sentinel, and the loss helpers the plugin calls for its
headroom: nanscope.loss.headroom, nanscope.loss.guard), else the run's (megatron, slime's loss: here nanscope's
model of it, nanscope.loss.as_is and what it calls). torch's own frames are skipped. An allocation is an op
output whose storage is new (not a view of an input).
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PLUGIN = ("/nanscope/slime_plugin/", "/nanscope/trace/", "/nanscope/loss/headroom.py", "/nanscope/loss/guard.py")
OWNERS = ("/nanscope/", "/megatron/", "/slime/")
SYNC_OPS = {"aten::_local_scalar_dense": "item", "aten::nonzero": "nonzero", "aten::masked_select": "masked_select"}
_HERE = __file__


def owner() -> str:
    """ "plugin" or "run": whose code issued the current op (see the module docstring)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if path != _HERE and any(o in path for o in OWNERS):
            return "plugin" if any(p in path for p in PLUGIN) else "run"
        frame = frame.f_back
    return "run"


class Audit(TorchDispatchMode):
    """Counts host syncs and the largest new tensor, per owner, while active (also the Python-level calls)."""

    def __init__(self):
        super().__init__()
        self.syncs: collections.Counter = collections.Counter()
        self.largest = {"plugin": (0, None), "run": (0, None)}
        self._patched: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        what = SYNC_OPS.get(name)
        if name == "aten::index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            what = "boolean mask"
        if name in ("aten::_to_copy", "aten::copy_") and _device_to_host(func, args, kwargs):
            what = "device-to-host copy"
        who = owner() if what is not None else None
        if what is not None:
            self.syncs[(who, what)] += 1
        out = func(*args, **kwargs)
        self._allocations(func, (args, list(kwargs.values())), out)
        return out

    def _allocations(self, func, args, out) -> None:
        inputs = {a.untyped_storage().data_ptr() for a in _tensors(args)}  # views and out= are not new
        fresh = [t for t in _tensors(out) if t.untyped_storage().data_ptr() not in inputs]
        if not fresh:
            return
        size = max(t.untyped_storage().nbytes() for t in fresh)
        who = owner()
        if size > self.largest[who][0]:
            self.largest[who] = (size, str(func))

    def __enter__(self):
        counted = self.syncs
        originals = (torch.Tensor.tolist, torch.tensor, torch.Tensor.new_tensor)

        def tolist(t):
            counted[(owner(), "tolist")] += 1
            return originals[0](t)

        def tensor(data, *a, **k):
            if k.get("device") is not None and not isinstance(data, torch.Tensor):
                counted[(owner(), "torch.tensor(..., device=)")] += 1
            return originals[1](data, *a, **k)

        def new_tensor(t, data, *a, **k):
            counted[(owner(), "new_tensor")] += 1
            return originals[2](t, data, *a, **k)

        self._patched = [(torch.Tensor, "tolist", originals[0]), (torch, "tensor", originals[1]),
                         (torch.Tensor, "new_tensor", originals[2])]  # fmt: skip
        torch.Tensor.tolist, torch.tensor, torch.Tensor.new_tensor = tolist, tensor, new_tensor
        return super().__enter__()

    def __exit__(self, *exc):
        for owner_, name, original in self._patched:
            setattr(owner_, name, original)
        return super().__exit__(*exc)

    def count(self, who: str) -> int:
        return sum(n for (w, _), n in self.syncs.items() if w == who)

    def table(self) -> dict:
        return {f"{w}: {what}": n for (w, what), n in sorted(self.syncs.items())}


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _device_to_host(func, args, kwargs) -> bool:
    """A copy to the CPU from another device (aten._to_copy or copy_)."""
    if func._schema.name == "aten::copy_":
        dst, src = args[0], args[1]
        return dst.device.type == "cpu" and src.device.type != "cpu"
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
