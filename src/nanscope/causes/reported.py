"""Causes real Megatron NaN reports had that nanscope does not build as hazards: doctor weighs them, repro does not.

Each is data: its mechanism, the flags that enable it, the observation that tells it apart, and the evidence that it
is real (file:line in the code at a release, or the public thread where it was found). Doctor's rules
(`launch.reported`) give each a status from a launch's flags; `nanscope hazards` and `nanscope repro` run the
catalogue (`causes.catalogue`), not these.

    from nanscope.causes.reported import REPORTED
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.causes.classes import HARDWARE, LOSS_NUMERICS, MODEL_BACKWARD, MODEL_FORWARD, OPTIMIZER

_CORE = "megatron-core"


@dataclass(frozen=True)
class Reported:
    """A cause found in real reports.

    Attributes:
        name: kebab-case id (doctor's candidates use it).
        mechanism: what goes wrong, in words.
        flags: the flags that enable it, as users write them.
        discriminator: the cheapest observation that confirms or excludes it.
        evidence: file:line at a release, or tracker#number, one each.
        cause_class: its class (causes.classes.CLASSES).
        makes: what it makes of a value: "NaN", "Inf", "large" (finite, far out of range).
    """

    name: str
    mechanism: str
    flags: tuple[str, ...]
    discriminator: str
    evidence: tuple[str, ...]
    cause_class: str
    makes: tuple[str, ...] = ("NaN", "Inf", "large")


GRAD_REDUCE_RACE = Reported(
    "grad-reduce-overlap-race",
    "The data-parallel gradient reduce overlaps the backward pass on its own CUDA streams (--overlap-grad-reduce, "
    "--tp-comm-overlap, several distributed-optimizer instances): a bucket reduced before its last gradient is "
    "written, or a buffer built on one stream and read on another without a wait, sums garbage; the check then sees "
    "a NaN the math never made. It depends on timing: the same data on the same GPU may pass.",
    ("--overlap-grad-reduce", "--tp-comm-overlap", "--num-distributed-optimizer-instances > 1"),
    "rerun the failing step with --overlap-grad-reduce and --tp-comm-overlap off: a race goes away, a cause in the "
    "data or the model does not",
    (
        "NVIDIA/Megatron-LM#2301 (NaN with data parallelism only; DDP built on a side stream)",
        "NVIDIA/Megatron-LM#6018 (NeMo 25.09: overlap_grad_reduce with MCore DDP initialised on a new CUDA stream)",
        f"{_CORE} 0.15.0rc0 distributed/param_and_grad_buffer.py:357-358, :382 (start_grad_sync: under "
        "overlap_grad_reduce the reduce is issued async, on the communication stream)",
    ),
    cause_class=HARDWARE,
)
LIBRARY_REGRESSION = Reported(
    "library-regression",
    "A kernel of a library the model runs on (TransformerEngine, flash-attention, torch, the container's CUDA) "
    "computes a wrong value on some shapes or GPUs: the same script and data were finite before an upgrade. No flag "
    "enables it; the versions do.",
    ("TransformerEngine, flash-attention or torch version (no flag)",),
    "the failing step rerun on the same GPU and on another (megatron-core's RerunStateMachine: 'reproducible on the "
    "same GPU', then on another), then a bisect over the "
    "TransformerEngine / flash-attention / torch versions on the saved step",
    (
        "NVIDIA/Megatron-LM#5026 (CI: NaN after the TransformerEngine 2.16 update; reproducible on the same GPU)",
        "NVIDIA/Megatron-LM#2597 (Qwen3-Next MTP NaN on Blackwell from a TransformerEngine bug, "
        "TransformerEngine#2489)",
        "alibaba/Pai-Megatron-Patch#680 (NaN loss at the first iteration; fixed by the 25.06 container)",
        "alibaba/ROLL#398 (NaN with torch 2.8 + vLLM 0.10.2, finite with torch 2.6 + vLLM 0.8.4)",
    ),
    cause_class=MODEL_FORWARD,
)
BAD_CHECKPOINT = Reported(
    "bad-checkpoint-resume",
    "The weights or optimizer state loaded at start are not what the run needs: a conversion that mismatched a "
    "layer, a resume whose optimizer state is from another layout, an uninitialised shard. The first step after the "
    "load is non-finite, or its grad norm or train/rollout log-prob gap is far out of range.",
    ("--load", "--finetune", "--ref-load", "trainer.resume_mode", "nemo_resume"),
    "the first step after the load: non-finite (or grad_norm / train_rollout_logprob_abs_diff out of range) there "
    "and not on a fresh start from the converted weights",
    (
        "NVIDIA-NeMo/Speech#14751 (Inf in a bucket's grad norm before the first step, only with nemo_resume)",
        "THUDM/slime#1695 (resume: very high rollout log-prob diff for a few steps)",
        "NVIDIA/Megatron-LM#780 (NaN while continuing from a checkpoint)",
    ),
    cause_class=MODEL_FORWARD,
)
CPU_OFFLOAD_OPTIMIZER = Reported(
    "cpu-offloaded-optimizer",
    "The optimizer state lives in host memory (--optimizer-cpu-offload, HybridDeviceOptimizer) and its copies "
    "to and from the device overlap the step (--overlap-cpu-optimizer-d2h-h2d); with --use-precision-aware-optimizer "
    "its moments are kept in lower precision. A copy read early, or a moment that underflows, makes the parameters "
    "non-finite after a step whose gradients were finite: the NaN shows in the next step's forward.",
    ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"),
    "the parameters after a step with finite gradients (the sentinel's class: optimizer); rerun with the optimizer "
    "on the device",
    (
        f"{_CORE} 0.15.0rc0 optimizer/cpu_offloading/hybrid_optimizer.py:114, :124 (gradients to host and "
        "parameters back with non_blocking copies) and :219-221 (on their own streams under "
        "overlap_cpu_optimizer_d2h_h2d, the default)",
        "alibaba/ChatLearn#283 (optimizer state offloading wrong on TransformerEngine 1.13 and later)",
        "alibaba/Pai-Megatron-Patch#542 (a fix to optimizer offloading)",
    ),
    cause_class=OPTIMIZER,
)
CP_ALL_MASKED = Reported(
    "cp-rank-all-masked",
    "With context parallelism each CP rank holds a slice of every sample; when all the tokens of a rank's slice are "
    "masked (padding, a prompt-only slice), a loss divided by that rank's own token count is 0 / 0 = NaN. "
    f"{_CORE} 0.12 to 0.15 divide the micro-batch's loss by its local token count unclamped "
    "(pipeline_parallel/schedules.py:236 at 0.15.0rc0); 0.16 clamps it to 1 (schedules.py:262).",
    ("--context-parallel-size > 1",),
    "the failing micro-batch's loss mask on each CP rank: one rank's slice all zero",
    (
        "NVIDIA/Megatron-LM#1764 (NaN loss and grad with CP when all tokens on a GPU are masked)",
        "NVIDIA-NeMo/Speech#14488 (NaN loss with context parallel on padded samples)",
        f"{_CORE} 0.15.0rc0 pipeline_parallel/schedules.py:236 (output_tensor /= num_tokens); fixed by Megatron-LM "
        "1aef9f8e, 0.16.0 schedules.py:262",
    ),
    cause_class=LOSS_NUMERICS,
    makes=("NaN",),
)
EMPTY_MICRO_BATCH = Reported(
    "empty-micro-batch",
    "A micro-batch with no tokens, or a gradient accumulation of no micro-batches: a mean over nothing is 0 / 0 = "
    "NaN (verl's FSDP actor divides the loss by ppo_mini_batch_size // ppo_micro_batch_size_per_gpu, 0 when the "
    "micro-batch is larger than a GPU's mini-batch share).",
    ("ppo_micro_batch_size_per_gpu > per-GPU mini-batch", "a micro-batch of padding only"),
    "the failing step's micro-batch sizes and loss-mask sums: one is 0",
    (
        "verl-project/verl#2505 (grad_norm NaN: gradient_accumulation 0 when ppo_micro_batch_size_per_gpu is too "
        "large)",
        "verl v0.4.1 verl/workers/actor/dp_actor.py:420 (gradient_accumulation = ppo_mini_batch_size // "
        "ppo_micro_batch_size_per_gpu)",
        f"{_CORE} 0.15.0rc0 pipeline_parallel/schedules.py:236 (a micro-batch's loss / its token count, unclamped)",
    ),
    cause_class=LOSS_NUMERICS,
    makes=("NaN", "Inf"),
)
NON_FLASH_MASK_PP = Reported(
    "non-flash-attention-mask-pp",
    "Without flash attention the attention mask goes through the unfused or fused-softmax path; with pipeline "
    "parallelism the mask a later stage builds or receives can be wrong for packed or padded samples, and a row "
    "masked everywhere is softmax(-inf...) = NaN.",
    ("--attention-backend other than flash (or no --use-flash-attn)", "--pipeline-model-parallel-size > 1"),
    "rerun with --attention-backend flash (or PP 1): the NaN goes away",
    ("alibaba/Pai-Megatron-Patch#60 (NaN grad norm when PP > 1 and flash attention is off)",),
    cause_class=MODEL_FORWARD,
    makes=("NaN",),
)
SP_NEW_ARCHITECTURE = Reported(
    "sp-new-architecture",
    "Sequence parallelism splits activations along the sequence across the TP group; a new architecture's layers "
    "(gated delta net / linear attention, MTP heads, hybrid Mamba) can gather or scatter them wrong under it, and "
    "the first step's gradients are NaN or far out of range.",
    ("--sequence-parallel", "a new architecture (Qwen3-Next, Qwen3.5/3.6, MTP layers, Mamba hybrids)"),
    "rerun the first step without --sequence-parallel (same TP): finite",
    (
        "verl-project/verl#6431 (Qwen3.6-35B: grad norm NaN at the first step with sequence parallelism, fine without)",
        "modelscope/ms-swift#7941 (qwen3_next: high grad_norm with TP)",
        "NVIDIA/Megatron-LM#2597 (Qwen3-Next with MTP: NaN grad norm)",
    ),
    cause_class=MODEL_BACKWARD,
)
FP8_RECIPE = Reported(
    "fp8-fp4-recipe",
    "fp8 or fp4 training (TransformerEngine's delayed, tensorwise, blockwise or MX recipes; NVFP4) scales each "
    "tensor into a narrow format: an amax history that misses a spike overflows to inf, and parameters kept in fp8 "
    "can be read before their master copy is written.",
    ("--fp8-format", "--fp8-recipe", "--fp4-format", "--fp8-param-gather"),
    "rerun the failing step in bf16 (no fp8/fp4 flags): finite",
    (
        "NVIDIA-NeMo/Megatron-Bridge#4168 (NaN/Inf grad norm: llama3 70B NVFP4 at 128 GPUs)",
        "verl-project/verl#6172 (FP8 end-to-end training on Blackwell)",
        "NVIDIA-NeMo/RL#3281 (fp8_param: the first step read uninitialised master-parameter shards)",
    ),
    cause_class=MODEL_FORWARD,
)

# the reports of stacks that train with megatron-core, and its code: a job without it is told none of them
MEGATRON_REPORTS = ("NVIDIA/Megatron-LM#", "NVIDIA-NeMo/", "alibaba/Pai-Megatron-Patch#", "THUDM/slime#")
VERL_SOURCES = ("verl-project/verl#", "verl v")  # verl's reports and code: its own mechanisms (its FSDP actor's)


def foreign(line: str) -> bool:
    """`line`, a reported cause's evidence (Reported.evidence), is another kind of job's than one without megatron-core:
    verl's, megatron-core's code, or a report of a stack that trains with it (TransformerEngine's, NeMo's, slime's)."""
    return line.startswith((*VERL_SOURCES, f"{_CORE} ", *MEGATRON_REPORTS))


REPORTED: tuple[Reported, ...] = (
    GRAD_REDUCE_RACE, LIBRARY_REGRESSION, BAD_CHECKPOINT, CPU_OFFLOAD_OPTIMIZER, CP_ALL_MASKED, EMPTY_MICRO_BATCH,
    NON_FLASH_MASK_PP, SP_NEW_ARCHITECTURE, FP8_RECIPE,
)  # fmt: skip
BY_NAME = {cause.name: cause for cause in REPORTED}
