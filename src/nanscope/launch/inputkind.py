"""What a file given as the launch script is, when it is not a bash launch script nanscope reads: a job log (then read
as the traceback), a Python file (a NeMo-Run recipe, a training script), a YAML config, or none of these.

    what_it_is("job.log", limit)      # "a job log"
"""

from __future__ import annotations

import re

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.facts import frameworks
from nanscope.facts.flags import BY_SPELLING, MEGATRON
from nanscope.launch.logs import PYTHON, scan

_SNIFF = 64 << 10  # bytes looked at
_PYTHON = PYTHON
LOG = "a job log"
_MAPPING = re.compile(r"\s{0,40}([\w.-]{1,80}):(?:\s|$)")
_ITEM = re.compile(r"\s{0,40}- ")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w{0,80} = \S", re.MULTILINE)
# a Python file's import of a framework's package: the framework it runs
_IMPORTS = (("trl", frameworks.TRL), ("verl", frameworks.VERL), ("openrlhf", frameworks.OPENRLHF),
            ("swift", frameworks.MS_SWIFT), ("llamafactory", frameworks.LLAMA_FACTORY), ("unsloth", frameworks.UNSLOTH),
            ("xtuner", frameworks.XTUNER))  # fmt: skip
_IMPORT = re.compile(r"^(?:from|import)\s+(" + "|".join(name for name, _ in _IMPORTS) + r")\b", re.MULTILINE)
# a YAML config's top-level keys that only one framework's configs hold all of
CONFIG_KEYS = (
    (frameworks.LLAMA_FACTORY, ("stage", "finetuning_type")),  # LLaMA-Factory's examples/*.yaml (llamafactory-cli)
    (frameworks.AXOLOTL, ("sample_packing", "micro_batch_size")),  # axolotl's examples/*.yml
)


def what_it_is(path: str, limit: int) -> str | None:
    """ "a job log", "a Python file (...)", a config (YAML, Python) or None (none: a bash script without a train
    command, or unreadable)."""
    try:
        data = inputs.read_bytes(path, "launch script", limit)[:_SNIFF]
    except UserError:
        return None
    text = data.decode("utf-8", "replace")
    head = text.lstrip()[:200]
    if head.startswith("#!") and "python" not in head.split("\n", 1)[0]:
        return None  # a shell script by its own word
    config = _yaml(text)  # before the log test: a config's `key: value` lines read as metric lines too
    if config is not None:
        return config
    try:
        found = scan([data], path)
    except UserError:
        found = None
    if found is not None and not found.quiet:
        return LOG
    if _PYTHON.search(text) is not None:
        if "nemo_run" in text:
            return "a Python file (a NeMo-Run recipe)"
        found = _IMPORT.search(text)
        return f"a Python file of {dict(_IMPORTS)[found[1]]}'s (it imports {found[1]})" if found else "a Python file"
    return _python_config(text) or _flag_list(text)


def _flag_list(text: str) -> str | None:
    """ "a list of Megatron-LM's flags (...)": 9 in 10 lines a `--flag [value]`, at least 3 of them Megatron's (an
    argument list pasted without the command that takes it)."""
    lines = [line.strip() for line in _content(text)]
    flags = [line.split()[0].rstrip("\\") for line in lines if line.startswith("--")]
    if len(flags) < 3 or len(flags) < 0.9 * len(lines):
        return None
    megatron = [flag for flag in flags if flag in BY_SPELLING and BY_SPELLING[flag].owner == MEGATRON]
    if len(megatron) < 3:
        return None
    return f"a list of Megatron-LM's flags ({', '.join(megatron[:3])}, ...) without the command that takes them"


def _content(text: str) -> list[str]:
    """The first 2000 lines of `text` that are neither blank nor a `#` comment."""
    return [line for line in text.splitlines()[:2000] if line.strip() and not line.lstrip().startswith("#")]


def _yaml(text: str) -> str | None:
    """ "a YAML config (top-level keys: ...)" where 9 in 10 lines that are not blank or a comment are a YAML mapping's
    `key: value` or a list's `- item`, and at least 3 are (a config given where its launch command goes)."""
    lines = _content(text)
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
