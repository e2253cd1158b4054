"""torch's CUDA out-of-memory error line, read as evidence (facts.signals `out-of-memory`): the run ended on memory,
not on a NaN or an Inf.

    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 13.91 GiB. GPU 0 has a total capacity of 79.11 GiB ...

Applied by launch.signals to a window around its anchor; bounded repeats only (linear in the line).
"""

from __future__ import annotations

import re

from nanscope.facts.signals import BY_ID

_OOM_EXC = re.compile(
    r"(?P<exc>torch(?:\.cuda)?\.OutOfMemoryError|OutOfMemoryError|RuntimeError)\s{0,4}:\s{0,4}CUDA out of"
)
_OOM_GPU = re.compile(r"GPU (?P<gpu>\d{1,6}) has a total capacity of (?P<total>[\d.]{1,12} \w{1,3})")
_OOM_SIZE = re.compile(r"Tried to allocate (?P<size>[\d.]{1,12} \w{1,3})")


def out_of_memory(text: str, before: str):
    """torch's `CUDA out of memory. Tried to allocate 13.91 GiB. GPU 0 has a total capacity of ...`: the run ended on
    memory. `GPU 0` is the process's local device index, not a global rank."""
    exc = _OOM_EXC.search(text) if "CUDA out of memory" in text else None
    if exc is None:  # a line that mentions it (a retry's warning) is no error line
        return None
    gpu, size = _OOM_GPU.search(text), _OOM_SIZE.search(text)
    said = ["CUDA out of memory"]
    if size is not None:
        said.append(f"tried to allocate {size['size']}")
    if gpu is not None:
        said.append(f"GPU {gpu['gpu']} of {gpu['total']} (the process's local device index, not a global rank)")
    return BY_ID["out-of-memory"], {"op": exc["exc"], "detail": ", ".join(said)}
