"""The sentinel's on-device flags of one phase: each check's float32 sum in the next slot of a device buffer.

A sum is NaN or +-inf iff some entry of the checked tensor is (NaN and inf propagate through a sum): one
reduction kernel, where isfinite(x).all() is 2 plus a bool tensor as large as x; the price is that finite
entries summing beyond the fp32 range (3.4e38) would be flagged, which no healthy activation or gradient
comes near. No check reads a value on the host: every _FOLD slots are reduced on the device to the first
non-finite slot's index, and the sentinel's read() copies that index to the host in its one sync. The slot
index is the call order, so the first non-finite check of the phase is recovered exactly.
"""

from __future__ import annotations

import torch

_FOLD = 1024  # slots per phase before they are folded into a running first-index (bounds memory)
ALL_FINITE = 1 << 62  # the first non-finite index when every check was finite
_grad_enabled, _set_grad_enabled = torch._C.is_grad_enabled, torch._C._set_grad_enabled
_sum, _F32 = torch.sum, torch.float32


class CheckSlots:
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
        self.slots: list[torch.Tensor] = []  # 0-dim views of its first entries

    @property
    def count(self) -> int:
        """Checks made since the last clear."""
        return self.folded + self.pending

    def slot(self, device: torch.device) -> torch.Tensor:
        """The next free slot (the caller writes it and counts it: `pending += 1`)."""
        if self.pending == len(self.slots):
            self.make_room(device)
        return self.slots[self.pending]

    def add(self, tensor: torch.Tensor, label) -> None:
        """Check `tensor` (any float dtype): its float32 sum goes into the next slot; one kernel, outside
        autograd (an output of a training forward is summed with grad mode off, not detached: cheaper).
        The module-output check inlines this."""
        slot = self.slot(tensor.device)
        if tensor.requires_grad and _grad_enabled():
            _set_grad_enabled(False)
            try:
                _sum(tensor, None, dtype=_F32, out=slot)
            finally:
                _set_grad_enabled(True)
        else:
            _sum(tensor, None, dtype=_F32, out=slot)
        self.pending += 1
        self.labels.append(label)

    def add_total(self, total: torch.Tensor, label) -> None:
        """A float32 sum computed by the caller (several tensors of one module output)."""
        self.slot(total.device).copy_(total)
        self.pending += 1
        self.labels.append(label)

    def make_room(self, device: torch.device) -> None:
        """The buffer at the first check, one more slot view while it has room, else a fold."""
        if self._buffer is None:
            self._buffer = torch.empty(_FOLD, dtype=torch.float32, device=device)
        if self.pending == self._buffer.numel():
            self.fold()
        else:
            self.slots.append(self._buffer[self.pending])

    def fold(self) -> None:
        """Reduce the pending slots on the device to the first bad index (no host sync)."""
        if not self.pending:
            return
        # temporaries of 1 byte a slot only (isfinite's float abs and an int64 index would be 4 and 8): on the
        # plugin's healthy step these are its largest tensors
        x = self._buffer[: self.pending]
        bad = (x != x) | (x == float("inf")) | (x == float("-inf"))
        at = bad.to(torch.uint8).argmax()  # the first bad slot (argmax takes the first of equal maxima)
        first = torch.where(bad.any(), at + self.folded, ALL_FINITE)
        self.first = first if self.first is None else torch.minimum(self.first, first)
        self.folded += self.pending
        self.pending = 0

    def result(self) -> torch.Tensor | None:
        """The first bad index on the device (ALL_FINITE: none), None when nothing was checked."""
        self.fold()
        return self.first

    def clear(self) -> None:
        """Start a new step (the buffer stays; the label list is cleared in place: the hooks hold it)."""
        self.labels.clear()
        self.first, self.folded, self.pending = None, 0, 0
