"""What a file given as the launch script is, when it is not a bash launch script nanscope reads: a job log (then read
as the traceback), a Python file (a NeMo-Run recipe, a training script), a YAML config, or none of these.

    what_it_is("job.log", limit)      # "a job log"
"""

from __future__ import annotations

import re

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.facts import frameworks
from nanscope.launch.logs import PYTHON, scan

_SNIFF = 64 << 10  # bytes looked at
_PYTHON = PYTHON
LOG = "a job log"
_MAPPING = re.compile(r"\s{0,40}([\w.-]{1,80}):(?:\s|$)")
_ITEM = re.compile(r"\s{0,40}- ")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w{0,80} = \S", re.MULTILINE)
# a YAML config's top-level keys that only one framework's configs hold all of
CONFIG_KEYS = (
    (frameworks.LLAMA_FACTORY, ("stage", "finetuning_type")),  # LLaMA-Factory's examples/*.yaml (llamafactory-cli)
    (frameworks.AXOLOTL, ("sample_packing", "micro_batch_size")),  # axolotl's examples/*.yml
)


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
    return _yaml(text) or _python_config(text)


def _yaml(text: str) -> str | None:
    """ "a YAML config (top-level keys: ...)" where 9 in 10 lines that are not blank or a comment are a YAML mapping's
    `key: value` or a list's `- item`, and at least 3 are (a config given where its launch command goes)."""
    lines = [line for line in text.splitlines()[:2000] if line.strip() and not line.lstrip().startswith("#")]
    shaped = sum(1 for line in lines if _MAPPING.match(line) or _ITEM.match(line))
    if shaped < 3 or shaped < 0.9 * len(lines):  # a pasted config keeps a line of prose or two
        return None
    top = [match[1] for line in lines if (match := _MAPPING.match(line)) is not None and not line[:1].isspace()]
    owner = next(
        (f" of {name}'s (its keys {', '.join(keys)})" for name, keys in CONFIG_KEYS if set(keys) <= set(top)), ""
    )
    return f"a YAML config{owner} (top-level keys: {', '.join(top[:5])}{', ...' if len(top) > 5 else ''})"


def _python_config(text: str) -> str | None:
    """ "a Python config (`name = value` lines ...)": at least 3 top-level Python assignments (spaces around `=`,
    which no bash assignment has), an mmengine-style config file (xtuner's, by its PROMPT_TEMPLATE)."""
    if len(_ASSIGNMENT.findall(text)) < 3:
        return None
    owner = " of xtuner's (PROMPT_TEMPLATE)" if "PROMPT_TEMPLATE." in text or "from xtuner" in text else ""
    return f"a Python config{owner} (`name = value` lines, an mmengine-style config file)"


def config_framework(kind: str | None) -> str | None:
    """The framework a config's kind names (`what_it_is`), or None."""
    return next((name for name in frameworks.NAMES if kind is not None and f" of {name}'s " in kind), None)
