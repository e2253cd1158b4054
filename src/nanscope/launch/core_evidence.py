"""Whether a job runs megatron-core, by what the input shows: the causes that live in megatron-core (its router, DDP
buckets, schedules, optimizer offload, TransformerEngine recipes: other_stacks.MEGATRON_CAUSES) are offered only
where something points to it.

    frames under megatron/core/, Megatron's error line, the rerun state machine's verdict      the traceback
    slime, Megatron-LM (its training loop), Pai-Megatron-Patch, NeMo's LLM recipes              the framework
    `megatron sft` (ms-swift), a `megatron` strategy or key (verl, ROLL, NeMo-RL), Megatron's
    parallel flags (`--tensor-model-parallel-size`, ...)                                          the launch script

A framework with both a Megatron and another backend (verl, ms-swift, ROLL, NeMo-RL) points to megatron-core only
by its launch or its frames; a stack without it (DeepSpeed, transformers, TRL, Megatron-DeepSpeed's engine, ...)
never does by its name.

    why = evidence(framework, traceback, script=script, view=view)   # None: nothing points to megatron-core
"""

from __future__ import annotations

from nanscope.facts import frameworks

# frameworks whose training is megatron-core's, whatever their launch
_ALWAYS = {
    frameworks.SLIME: "slime trains with megatron-core",
    frameworks.MEGATRON_LM: "Megatron-LM's training loop (megatron-core's since core 0.4; an older Megatron-LM has "
    "its own copies)",
    frameworks.PAI: "Pai-Megatron-Patch trains with Megatron-LM",
    frameworks.NEMO: "NeMo's language-model training is Megatron's (megatron-core, Apex's Megatron before 2023)",
}
_PARALLEL = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
             "--expert-model-parallel-size")  # fmt: skip


def evidence(framework, traceback=None, *, script=None, view=None) -> str | None:
    """What in the input points to megatron-core, in words; None: nothing does."""
    if traceback is not None:
        said = _traceback(traceback, own_copy=framework.name in frameworks.WITHOUT_MEGATRON)
        if said is not None:
            return said
    if framework.name in _ALWAYS:
        return _ALWAYS[framework.name]
    if script is not None:
        if script.train_script.startswith("megatron "):
            return f"the `{script.train_script.split()[0]}` command (ms-swift's Megatron backend)"
        word = next((word for word in script.argv if "megatron" in word.lower()), None)
        if word is not None:
            return f"the launch gives {word[:80]}"
    if view is not None:
        flag = next((flag for flag in _PARALLEL if view.has(flag)), None)
        if flag is not None:
            return f"Megatron's parallel flags ({view.show(flag)})"
    return None


def _traceback(traceback, own_copy: bool = False) -> str | None:
    """What the traceback shows (`own_copy`: a stack that trains without megatron-core, whose `megatron/` frames are
    its own copy of Megatron-LM: gpt-neox's)."""
    frames = traceback.megatron_frames()
    if frames:
        name, line, function = frames[-1]
        return f"frames in megatron-core ({name}:{line} {function})"
    megatron = [] if own_copy else [f for f in traceback.frames if "/megatron/" in f.path.replace("\\", "/")]
    if megatron:
        return f"frames under megatron/ ({megatron[-1].path.rsplit('/', 1)[-1]}:{megatron[-1].line})"
    failure = traceback.failure
    if failure is not None and failure.format not in ("signal",):
        what = "the rerun state machine's verdict" if failure.format == "rerun" else "Megatron's error line"
        return f"{what} (line {failure.line})"
    return None
