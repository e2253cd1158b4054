"""The libraries an input shows where it names no framework nanscope catalogues (facts.frameworks): the packages its
frames run from, the loggers its lines print through. Said, never weighed: no cause is judged by them.

    File "/venv/lib/python3.10/site-packages/accelerate/accelerator.py", line 1905    accelerate (its frames)
    INFO:tensorflow:global_step/sec: 3.1                                             tensorflow (its log lines)

    shown(frames, lines) -> "accelerate (its frames), tensorflow (its log lines)" or None
"""

from __future__ import annotations

import re

from nanscope.facts import frameworks

# an installed package's frame: the directory under site-packages or dist-packages
_PACKAGE = re.compile(r"/(?:site|dist)-packages/(?P<name>[A-Za-z_]\w{0,40})/")
# Python's logging.basicConfig format, `LEVEL:logger:message` (CPython Lib/logging/__init__.py BASIC_FORMAT), after
# a launcher's `[rankN]:` prefix where there is one
_LOGGER = re.compile(
    r"^(?:\[rank\d{1,6}\]:\s{0,4})?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<name>[A-Za-z_]\w{0,40})[.:]"
)
# packages under every job whatever trains it: the tensor library, its compilers, Python's plumbing
_PLUMBING = frozenset({"torch", "numpy", "triton", "typing_extensions", "six", "tqdm", "_pytest", "pytest", "pluggy",
                       "IPython", "ipykernel", "traitlets", "tornado", "root", "__main__", "py", "pkg_resources"})  # fmt: skip
MAX_SHOWN = 4


def shown(frames, lines: list[str]) -> str | None:
    """The libraries `frames` (launch.frames.Frame) run from and `lines` log through, in order of appearance, with
    where each was seen (None: none but plumbing)."""
    found: dict[str, str] = {}
    for frame in frames:
        match = _PACKAGE.search(frame.path.replace("\\", "/"))
        if match is not None and match["name"] not in _PLUMBING:
            found.setdefault(match["name"], "its frames")
    for line in lines:
        match = _LOGGER.match(line[:200])
        if match is not None and match["name"] not in _PLUMBING:
            found.setdefault(match["name"], "its log lines")
    if not found:
        return None
    return ", ".join(f"{name} ({how})" for name, how in list(found.items())[:MAX_SHOWN])


def named_stack(frames) -> str | None:
    """The uncatalogued stack a frame's package names (facts.frameworks.STACK_PACKAGES; None: none)."""
    for frame in frames:
        match = _PACKAGE.search(frame.path.replace("\\", "/"))
        if match is not None and match["name"] in frameworks.STACK_PACKAGES:
            return frameworks.STACK_PACKAGES[match["name"]]
    return None
