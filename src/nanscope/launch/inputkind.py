"""What a file given as the launch script is, when it is not a bash launch script nanscope reads: a job log (then read
as the traceback), a Python file (a NeMo-Run recipe, a training script), a YAML config, or none of these.

    what_it_is("job.log", limit)      # "a job log"
"""

from __future__ import annotations

import re

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.launch.logs import PYTHON, scan

_SNIFF = 64 << 10  # bytes looked at
_PYTHON = PYTHON
LOG = "a job log"
_MAPPING = re.compile(r"\s{0,40}([\w.-]{1,80}):(?:\s|$)")
_ITEM = re.compile(r"\s{0,40}- ")


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
    return _yaml(text)


def _yaml(text: str) -> str | None:
    """ "a YAML config (top-level keys: ...)" where every line that is not blank or a comment is a YAML mapping's
    `key: value` or a list's `- item`, and at least 3 are (a config given where its launch command goes)."""
    lines = [line for line in text.splitlines()[:2000] if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) < 3 or not all(_MAPPING.match(line) or _ITEM.match(line) for line in lines):
        return None
    top = [match[1] for line in lines if (match := _MAPPING.match(line)) is not None and not line[:1].isspace()]
    return f"a YAML config (top-level keys: {', '.join(top[:5])}{', ...' if len(top) > 5 else ''})"
