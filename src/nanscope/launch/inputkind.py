"""What a file given as the launch script is, when it is not a bash launch script nanscope reads: a job log (then read
as the traceback), a Python file (a NeMo-Run recipe, a training script), or neither.

    what_it_is("job.log", limit)      # "a job log"
"""

from __future__ import annotations

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.launch.logs import PYTHON, scan

_SNIFF = 64 << 10  # bytes looked at
_PYTHON = PYTHON
LOG = "a job log"


def what_it_is(path: str, limit: int) -> str | None:
    """ "a job log", "a Python file (...)" or None (neither: a bash script without a train command, or unreadable)."""
    try:
        data = inputs.read_bytes(path, "launch script", limit)[:_SNIFF]
    except UserError:
        return None
    text = data.decode("utf-8", "replace")
    head = text.lstrip()[:200]
    if head.startswith("#!") and "python" not in head.split("\n", 1)[0]:
        return None  # a shell script by its own word
    try:
        found = scan([data], path)
    except UserError:
        found = None
    if found is not None and not found.quiet:
        return LOG
    if _PYTHON.search(text) is not None:
        return "a Python file (a NeMo-Run recipe)" if "nemo_run" in text else "a Python file"
    return None
