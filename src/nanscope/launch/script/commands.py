"""Which command of a launch script trains, and which runs another script: read from a command's words.

train_command(["torchrun", "--nproc_per_node", "8", "pretrain_gpt.py", "--tp", "2"])
    -> ("pretrain_gpt.py", ["--tp", "2"], ["torchrun", "--nproc_per_node", "8"])
called_script(["srun", "bash", "run.sh", "a"]) -> ["bash", "run.sh", "a"]
"""

from __future__ import annotations

import os
import re

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")


_PREFIXES = ("srun", "sbatch", "exec", "nohup", "time", "mpirun", "env")


def called_script(words: list[str]) -> list[str] | None:
    """`bash run.sh a b`, `./run.sh a b`, `srun bash run.sh`, `sbatch run.sh`: ["bash", "run.sh", "a", "b"]; None for
    any other command."""
    i = 0
    while i < len(words) - 1 and os.path.basename(words[i]) in _PREFIXES:
        i += 1
        while i < len(words) - 1 and words[i].startswith("-"):  # the prefix's own options (srun -N 2 ...)
            i += 2 if "=" not in words[i] and not words[i + 1].endswith(".sh") else 1
    rest = words[i:]
    if len(rest) > 1 and os.path.basename(rest[0]) in ("bash", "sh") and rest[1].endswith(".sh"):
        return rest
    if rest and rest[0].endswith(".sh") and (i > 0 or "/" in rest[0]):
        return ["bash", *rest]
    return None


def inline_script(words: list[str]) -> str | None:
    """`bash -c "torchrun ..."`, `srun -N 2 bash -lc '...'`: the string bash runs; None for any other command."""
    i = 0
    while i < len(words) - 1 and os.path.basename(words[i]) in _PREFIXES:
        i += 1
        while i < len(words) - 1 and words[i].startswith("-"):  # the prefix's own options (srun -N 2 ...)
            i += 2 if "=" not in words[i] and words[i + 1] not in ("bash", "sh") else 1
    rest = words[i:]
    if not rest or os.path.basename(rest[0]) not in ("bash", "sh"):
        return None
    j = 1
    while j < len(rest) - 1 and rest[j].startswith("-") and rest[j] != "-c" and not rest[j].endswith("c"):
        j += 1  # bash's own options before -c (-l, -e, -x)
    if j < len(rest) - 1 and rest[j].startswith("-") and rest[j].endswith("c"):  # -c, -lc, -ec
        return rest[j + 1]
    return None


def train_command(words: list[str]) -> tuple[str, list[str], list[str]] | None:
    """Find the training command in one command's words: `python[3] [-opts] <script>.py args...` or `python3 -m
    <module> args...`, the same after a launcher (torchrun, deepspeed, accelerate launch: its options are skipped),
    or a training CLI (`megatron sft ...`, `swift rlhf ...`, `nemo llm pretrain ...`): (script, args, words before)."""
    for i, word in enumerate(words):
        name = os.path.basename(word)
        if _PYTHON.match(name) or name in _LAUNCHERS:
            found = _python_args(words, i + 1) if _PYTHON.match(name) else _launched(words, i + 1)
            if found is not None:  # a launcher keeps its own options (torchrun --nproc_per_node 8 ...); python's go
                script, at = found
                launched = not _PYTHON.match(name) or words[i + 1 : i + 3] == ["-m", "torch.distributed.run"]
                args = words[at + (2 if script.startswith("-m ") else 1) :]
                return script, args, words[:at] if launched else words[:i]
        elif name in _CLIS and i + 1 < len(words) and words[i + 1] in _CLIS[name]:
            return f"{name} {words[i + 1]}", words[i + 2 :], words[:i]
    return None


# Launchers whose options come before the training script or module; training CLIs and their subcommands.
_LAUNCHERS = ("torchrun", "deepspeed", "accelerate", "torch.distributed.run", "torch.distributed.launch", "colossalai")
_CLIS = {
    "megatron": ("sft", "pt", "rlhf", "rlhf_grpo"),  # ms-swift's Megatron backend
    "swift": ("sft", "pt", "rlhf"),
    "nemo": ("llm",),
    "xtuner": ("train",),  # `NPROC_PER_NODE=8 xtuner train CONFIG --deepspeed deepspeed_zero2`
    "llamafactory-cli": ("train",),  # `llamafactory-cli train config.yaml`
    "tune": ("run",),  # torchtune's `tune run --nproc_per_node 8 RECIPE --config CONFIG`
}


def _python_args(words: list[str], j: int) -> tuple[str, int] | None:
    """After `python3`: `[-opts] <script>.py args` or `-m <module> args`: (the script, where it starts); None for
    `-c` and anything else."""
    while j < len(words) and words[j].startswith("-") and words[j] not in ("-m", "-c"):
        j += 1
    if j < len(words) and words[j].endswith(".py"):
        return words[j], j
    if j + 1 < len(words) and words[j] == "-m" and words[j + 1] not in ("pip", "torch.distributed.run"):
        return f"-m {words[j + 1]}", j
    if j + 1 < len(words) and words[j] == "-m":  # python -m torch.distributed.run ...: a launcher
        return _launched(words, j + 2)
    return None


def _launched(words: list[str], j: int) -> tuple[str, int] | None:
    """After a launcher: its options, then `<script>.py args` or `-m/--module <module> args`."""
    for k in range(j, len(words)):
        if words[k].endswith(".py") and not words[k].startswith("-"):
            return words[k], k
        if words[k] in ("-m", "--module") and k + 1 < len(words):
            return f"-m {words[k + 1]}", k
    return None
