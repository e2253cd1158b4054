"""The causes real reports had (causes.reported), each with its status from a launch's flags, whichever framework
wrote them (launch.flagview), and the traceback's and metrics' evidence.

    enabled      the flags switch the mechanism on (evidence: those flags)
    ruled-out    the flags, or the framework's own code, exclude it (evidence: the flag, or file:line)
    undecidable  no flag decides it (a library version, the data)

Pure: `reported(context)` -> [Candidate], in the catalogue's order (launch.candidates sorts by status).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nanscope.causes import neutral
from nanscope.causes import reported as causes
from nanscope.facts import frameworks, wordings
from nanscope.facts.releases import SLIME_V0_1_0
from nanscope.launch.flagview import FlagView
from nanscope.launch.status import ENABLED, RULED_OUT, UNDECIDABLE
from nanscope.launch.words import count

# Names of the new architectures whose sequence-parallel kernels real reports found NaN in (model paths, flags).
_NEW_ARCHITECTURE = re.compile(r"qwen3[-_.]?next|qwen3[._]?[56]|gated.?delta|nemotron-h|mamba|hybrid", re.IGNORECASE)
_NEW_ARCHITECTURE_FLAGS = ("--mtp-num-layers", "--experimental-attention-variant", "--hybrid-override-pattern")
_MODEL_PATHS = ("--hf-checkpoint", "--model", "--load", "--pretrained-checkpoint", "--tokenizer-model")
_CLAMPED_FROM = "0.16.0"  # megatron-core divides a micro-batch's loss by max(its token count, 1) from here on


@dataclass
class Context:
    """What the rules read.

    Attributes:
        framework: facts.frameworks name of the launch.
        view: its flags, Megatron's spelling.
        pp, cp: its pipeline and context parallel sizes (None: unknown).
        core: the megatron-core releases the traceback fits (None: unknown).
        unread: a model-args file the script sources was not read (flags in it unknown).
        defaults_known: flags not given are at Megatron's default (off), as in slime and Megatron-LM.
    """

    framework: str
    view: FlagView
    pp: int | None
    cp: int | None
    core: tuple[str, ...] | None = None
    unread: bool = False
    defaults_known: bool = True
    script: bool = True  # a launch script was read (False: no flag, and no sentence about "the script")
    started: tuple[int, int] | None = None  # the log's first Megatron iteration line: (its iteration, its line)
    loaded: tuple[int, str] | None = None  # a line of the log that says it loaded a checkpoint: (line, text)
    loaded_then: int | None = None  # the first metric line after that load, non-finite already (its line)
    versions: tuple = ()  # the library versions the log prints (launch.versions.Version)
    overlap_off: str | None = None  # what in the frames shows the data-parallel reduce ran unoverlapped


def reported(context: Context) -> list[tuple[causes.Reported, str, list[str]]]:
    """(cause, status, evidence) for every reported cause."""
    rules = {
        causes.GRAD_REDUCE_RACE.name: _race,
        causes.LIBRARY_REGRESSION.name: _library,
        causes.BAD_CHECKPOINT.name: _checkpoint,
        causes.CPU_OFFLOAD_OPTIMIZER.name: _offload,
        causes.CP_ALL_MASKED.name: _cp_masked,
        causes.EMPTY_MICRO_BATCH.name: _empty,
        causes.NON_FLASH_MASK_PP.name: _mask_pp,
        causes.SP_NEW_ARCHITECTURE.name: _sp_new,
        causes.FP8_RECIPE.name: _fp8,
    }
    return [(cause, *rules[cause.name](context)) for cause in causes.REPORTED]


def _given(context: Context, flags: tuple[str, ...]) -> list[str]:
    view = context.view
    return [view.show(flag) for flag in flags if view.on(flag) or (view.number(flag) or 0) > 1]


def _off(context: Context, flags: tuple[str, ...], why: str) -> tuple[str, list[str]]:
    """Ruled out where flags not given are off; undecidable where the framework's defaults are not read."""
    if not context.script:
        return UNDECIDABLE, [f"no launch script: whether it sets {', '.join(flags)} is unknown"]
    if context.defaults_known:
        return RULED_OUT, [f"no {', no '.join(flags)}: {why}"]
    owner = "the framework" if context.framework == frameworks.UNKNOWN else context.framework
    return UNDECIDABLE, [f"no {', no '.join(flags)} in the script, and {owner}'s defaults are not read"]


def _race(context: Context) -> tuple[str, list[str]]:
    if context.framework == frameworks.OPENRLHF:
        return RULED_OUT, ["OpenRLHF trains with DeepSpeed, not megatron-core's DDP"]
    flags = ("--overlap-grad-reduce", "--tp-comm-overlap", "--num-distributed-optimizer-instances")
    on = _given(context, flags)
    if not on and context.overlap_off is not None:  # the frames show the reduce ran after the backward
        return RULED_OUT, [context.overlap_off]
    if on:
        return ENABLED, on + ["the reduce runs on its own stream while the backward still writes gradients"]
    return _off(context, flags[:2], "the data-parallel reduce runs after the backward, on the same stream")


MEGATRON_LIBRARIES = "no flag decides it: the TransformerEngine, flash-attention and torch versions do"


def _library(context: Context) -> tuple[str, list[str]]:
    said = [f"the versions the log prints: {', '.join(map(str, context.versions))}"] if context.versions else []
    return UNDECIDABLE, [MEGATRON_LIBRARIES, *said]  # a job without megatron-core: neutral.LIBRARIES (candidates)


# flag -> what a run that gives it loads, in that flag's own meaning (Megatron-LM arguments.py at core_v0.15.0rc0;
# ms-swift passes --load and --finetune to Megatron; verl's trainer.resume_mode, NeMo's resume.* are their own)
_LOADS = {
    "--load": "weights and, unless --no-load-optim or --finetune, the optimizer and RNG state",
    "--finetune": "weights only: no optimizer or RNG state, the iteration reset to 0 (Megatron's --finetune)",
    "--pretrained-checkpoint": "weights only (a pretrained checkpoint: no optimizer state)",
    "--resume-from-checkpoint": "weights and optimizer state (a resumed run)",
    "--resume-mode": "weights and optimizer state of the last checkpoint (a resumed run)",
}


def _loads(view: FlagView, flag: str) -> str:
    """What `flag` loads, as the framework that wrote it means it."""
    if view.show(flag).startswith("resume.restore_config"):
        return "weights (NeMo's restore_config: the optimizer state only where load_optim_state is set)"
    if view.show(flag).lstrip("+").split("=", 1)[0].endswith("resume_if_exists"):
        return (
            "weights and optimizer state of the run directory's last checkpoint, where one exists (NeMo's "
            "resume_if_exists)"
        )
    return _LOADS[flag]


# LLaMA-Factory up to v0.3.3: --checkpoint_dir loads the fine-tuned (LoRA) checkpoints it names onto the model
# (hiyouga/LLaMA-Factory v0.1.0 src/llmtuner/hparams/model_args.py:50-53, src/llmtuner/tuner/core/adapter.py:52-92;
# gone from model_args.py in v0.4.0)
_DELTA = "--checkpoint-dir"
_DELTA_LOADS = ("the fine-tuned (LoRA) checkpoints it names, onto the model (LLaMA-Factory up to v0.3.3: v0.1.0 "
                "src/llmtuner/tuner/core/adapter.py:52-92)")  # fmt: skip


def _fresh(view: FlagView, line: int) -> str:
    """--load beside a log whose first Megatron iteration is 1: no training checkpoint was resumed."""
    same = (
        " (--save's directory too: a first run finds nothing there)"
        if view.value("--save") == view.value("--load")
        else ""
    )
    return (f"{view.show('--load')}{same}, but the log's first iteration line (line {line}) is iteration 1: Megatron "
            "resumes a checkpoint at the iteration after the one it saved, so none was resumed: the directory held none "
            "(Megatron then starts from its own initialisation) or weights saved at iteration 0 (a converted release "
            "checkpoint); Megatron-LM core_v0.15.0rc0 megatron/training/checkpointing.py:1088-1100 (no tracker file: "
            "start from random), :1600-1610 (the saved iteration, 0 for --finetune or a release)")  # fmt: skip


def _checkpoint(context: Context) -> tuple[str, list[str]]:
    view = context.view
    given = [flag for flag in _LOADS if view.has(flag) and not view.off(flag)]
    delta = context.framework == frameworks.LLAMA_FACTORY and view.has(_DELTA) and not view.off(_DELTA)
    if given == ["--load"] and not delta and context.started is not None and context.started[0] == 1:
        return UNDECIDABLE, [_fresh(view, context.started[1])]
    if given or delta:
        said = [f"{view.show(flag)}: the run loads {_loads(view, flag)}" for flag in given]
        return ENABLED, said + ([f"{view.show(_DELTA)}: the run loads {_DELTA_LOADS}"] if delta else [])
    said = [] if context.loaded is None else [f"the log says the run loaded one at line {context.loaded[0]}: "
                                              f"`{context.loaded[1][:120]}`"]  # fmt: skip
    if said and context.loaded_then is not None:  # what the cause's discriminator looks for, in the log already
        said.append(f"the first metric line after it (line {context.loaded_then}) is already non-finite, as a bad "
                    "load makes it; a fresh start from the same weights would tell")  # fmt: skip
    if not context.script:
        return UNDECIDABLE, said or ["no launch script: whether the run loads a checkpoint is unknown"]
    return UNDECIDABLE, said or [
        "the script loads no checkpoint by these flags; a conversion of the weights may still be bad"
    ]


def _offload(context: Context) -> tuple[str, list[str]]:
    flags = ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer")
    on = _given(context, flags)
    if context.view.on("--optimizer-cpu-offload"):
        return ENABLED, on
    if on:
        return ENABLED, on + ["(without --optimizer-cpu-offload: the optimizer's moments in lower precision)"]
    return _off(context, flags[:1], "the optimizer state stays on the device")


def _cp_masked(context: Context) -> tuple[str, list[str]]:
    if context.cp is None:
        return UNDECIDABLE, ["the context-parallel size is unknown"]
    if context.cp == 1:
        return RULED_OUT, ["CP 1: every rank holds whole samples"]
    if context.framework == frameworks.SLIME:
        return RULED_OUT, [
            f"CP {context.cp}, but slime divides each CP slice's masked sum by clamp_min(the whole sample's mask sum, "
            f"1) (slime/backends/megatron_utils/cp_utils.py:84-92, {SLIME_V0_1_0}) and hands megatron-core a token "
            "count of 1 (loss.py:395-397): an all-masked slice adds 0"
        ]
    return _by_core(context, f"CP {context.cp}: a CP rank's slice may be all masked")


def _by_core(context: Context, head: str) -> tuple[str, list[str]]:
    """megatron-core 0.12 to 0.15 divide a micro-batch's loss by its token count unclamped; 0.16 on clamp it."""
    core = context.core
    clamped = core is not None and all(
        wordings.RELEASES.index(release) >= wordings.RELEASES.index(_CLAMPED_FROM) for release in core
    )
    if clamped:
        return RULED_OUT, [f"{head}, but megatron-core {core[0]}+ clamps the token count to 1 (schedules.py:262)"]
    where = "megatron-core 0.15.0rc0 pipeline_parallel/schedules.py:236: output_tensor /= num_tokens, unclamped"
    known = "" if core is None else f" (the traceback's megatron-core: {core[0]}..{core[-1]})"
    return ENABLED, [head + known, where]


def _empty(context: Context) -> tuple[str, list[str]]:
    if context.framework == frameworks.SLIME:
        return RULED_OUT, [
            f"slime divides each sample's masked sum by clamp_min(its mask sum, 1) (cp_utils.py:60, {SLIME_V0_1_0}) "
            "and hands megatron-core a token count of 1 (loss.py:395-397): an empty micro-batch adds 0"
        ]
    if context.framework == frameworks.VERL:
        return _verl_accumulation(context)
    if context.framework == frameworks.OPENRLHF:
        return UNDECIDABLE, ["OpenRLHF's loss aggregation is not read"]
    if context.framework in frameworks.WITHOUT_MEGATRON:  # its own loss, not megatron-core's schedules'
        said = neutral.EMPTY_BATCH.get(context.framework, neutral.ALL_MASKED)
        return UNDECIDABLE, [said, "no flag decides it: the data does"]
    status, evidence = _by_core(context, neutral.PADDING_ONLY)
    return (status if status == RULED_OUT else UNDECIDABLE), evidence + ["no flag decides it: the data does"]


def _verl_accumulation(context: Context) -> tuple[str, list[str]]:
    """verl's FSDP actor: gradient_accumulation = ppo_mini_batch_size // ppo_micro_batch_size_per_gpu."""
    view = context.view
    if view.value("--verl-strategy") == "megatron":
        return UNDECIDABLE, ["verl's Megatron actor: the micro-batches are megatron-core's, their token counts data"]
    mini, micro = view.number("--ppo-mini-batch-size"), view.number("--ppo-micro-batch-size-per-gpu")
    n, gpus = view.number("--rollout-n") or 1, (view.number("--nnodes") or 1) * (view.number("--nproc-per-node") or 0)
    if mini is None or micro is None or not gpus:
        return UNDECIDABLE, ["ppo_mini_batch_size, ppo_micro_batch_size_per_gpu or the GPU count not given"]
    share = int(mini * n) // int(gpus)
    arithmetic = f"ppo_mini_batch_size {mini:g} x rollout.n {n:g} / {count(gpus, 'GPU')} = {share} per GPU"
    where = "verl v0.4.1 verl/workers/actor/dp_actor.py:420"
    if share // int(micro) == 0:
        return ENABLED, [f"{arithmetic} < ppo_micro_batch_size_per_gpu {micro:g}: gradient_accumulation 0", where]
    return RULED_OUT, [f"{arithmetic} >= ppo_micro_batch_size_per_gpu {micro:g}: gradient_accumulation >= 1", where]


def _mask_pp(context: Context) -> tuple[str, list[str]]:
    if context.pp is None:
        return UNDECIDABLE, ["the pipeline size is unknown"]
    if context.pp == 1:
        return RULED_OUT, ["PP 1: no stage receives another's attention mask"]
    backend, view = context.view.value("--attention-backend"), context.view
    if backend == "flash" or view.on("--use-flash-attn"):
        return RULED_OUT, [
            f"PP {context.pp}, but {view.show('--attention-backend' if backend else '--use-flash-attn')}"
        ]
    if backend in ("unfused", "local", "fused"):
        return ENABLED, [f"PP {context.pp}", view.show("--attention-backend")]
    return UNDECIDABLE, [f"PP {context.pp}; the attention backend is megatron-core's choice (auto): unknown"]


def _sp_new(context: Context) -> tuple[str, list[str]]:
    view = context.view
    if not context.script:  # neither the flag nor the model is known: no default of the framework's decides it
        return UNDECIDABLE, ["no launch script: whether it sets --sequence-parallel on a new architecture is unknown"]
    sp = view.on("--sequence-parallel") or (
        context.framework == frameworks.VERL and not view.off("--sequence-parallel")
    )
    if not sp:
        return _off(context, ("--sequence-parallel",), "activations are not split along the sequence")
    marks = [view.show(flag) for flag in _NEW_ARCHITECTURE_FLAGS if view.has(flag)]
    marks += [view.show(flag) for flag in _MODEL_PATHS if _NEW_ARCHITECTURE.search(view.value(flag) or "")]
    shown = (
        view.show("--sequence-parallel") if view.has("--sequence-parallel") else "sequence_parallel (verl's default)"
    )
    if marks:
        return ENABLED, [shown, *marks]
    if context.unread:
        return UNDECIDABLE, [shown, "the model-args file was not read: the architecture is unknown"]
    return RULED_OUT, [shown, "no flag or model path of a new architecture (MTP, gated delta net, Mamba hybrids)"]


# Megatron-Bridge's performance recipes' compute precision (NVIDIA-NeMo/Megatron-Bridge 067f987
# scripts/performance/argument_parser.py:695: bf16, fp8_cs, fp8_mx, fp8_sc, nvfp4; default bf16)
_COMPUTE = "--compute-dtype"


def _fp8(context: Context) -> tuple[str, list[str]]:
    flags = ("--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4", "--fp8", "--fp8-param-gather")
    given = [context.view.show(flag) for flag in flags if context.view.has(flag) and not context.view.off(flag)]
    if given:
        return ENABLED, given
    dtype = (context.view.value(_COMPUTE) or "").lower() if context.framework == frameworks.NEMO else ""
    where = "NVIDIA-NeMo/Megatron-Bridge 067f987 scripts/performance/argument_parser.py:695"
    if dtype.startswith(("fp8", "nvfp4")):
        return ENABLED, [f"{context.view.show(_COMPUTE)}: Megatron-Bridge's {dtype} compute precision ({where})"]
    if dtype in ("bf16", "fp16"):
        return RULED_OUT, [f"{context.view.show(_COMPUTE)}: Megatron-Bridge's {dtype} compute precision, no fp8 or fp4 "
                           f"({where})"]  # fmt: skip
    return _off(context, ("--fp8-format", "--fp4-format"), "bf16/fp16 training")
