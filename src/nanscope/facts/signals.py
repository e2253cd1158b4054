"""NaN and Inf evidence other than Megatron's own check: the lines other stacks print when a value goes non-finite.

Each record says what the line means, what it rejected or skipped, whether the run ends there, where the words are
printed (file:line at a release nanscope read), and the catalogued causes it supports. The reader is
launch.signals; the words are matched there.

    deepspeed-overflow     DeepSpeed's fp16 loss scaler: a step with inf/NaN gradients skipped, the scale lowered
    loss-scale-minimum     ... the scale already at its minimum and still overflowing: the run ends
    overflow-exit          an overflow monitor ended the run after N consecutive skipped steps (gpt-neox)
    anomaly-nan            PyTorch's anomaly mode: a backward function returned NaN (which one, which output)
    anomaly-forward        ... the warning before it, naming the backward function whose forward is traced
    probability-assert     torch.multinomial (sampling): the probabilities hold inf, NaN or a negative value
    bad-probs              ... a sampler's own guard says so (`Bad probs detected: NaN: True`): not fatal by itself
    device-assert          a CUDA device-side assert (an index out of range: what NaN logits make of an argmax)
    nccl-timeout           a collective waited past its timeout: a rank left it (one that hit a NaN, or died)
    skip-nonfinite-grad    a framework skipped the optimizer step on a non-finite gradient norm (verl, ColossalAI)
    logged-nonfinite       TensorBoard's writer refused a non-finite scalar
    nonfinite-error        any other error line whose message names NaN or Inf
    nonfinite-message      any other log line that says a loss or gradient is NaN or Inf
    printed-tensor         a tensor printed by the job's own code (`tensor(nan, device='cuda:0')`) holds NaN or Inf
    nanscope-report        nanscope's own plugin (verl's or slime's) found a non-finite step and wrote its report
    nanscope-cleaned       ... replaced non-finite loss inputs (the data's) and took their tokens out of the loss
    nanscope-headroom      ... saw a log-ratio the loss exponentiates near or past fp32's exp overflow (88.72)
    out-of-memory          torch's CUDA allocator ran out of memory: the run ended, and on no NaN or Inf
"""

from __future__ import annotations

from dataclasses import dataclass

DEEPSPEED = "DeepSpeed 0.16.4"


@dataclass(frozen=True)
class Signal:
    """One kind of NaN/Inf evidence line.

    Attributes:
        id: its one spelling (doctor's JSON `failure.check` when the evidence is this line).
        value: what was non-finite: "NaN", "Inf", "NaN or Inf", or "-" (a hang or a skip that names neither).
        quantity: where: "gradient", "loss", "probabilities", "backward", "collective", "index", "metric", "model"
            (a module's output or gradient, or the loss: what nanscope's sentinel watches).
        fatal: the run ends at this line (an exception); else it goes on (a skipped step, a warning).
        stack: the software that prints it.
        source: where its words are, "<release> <file>:<line>", or "" where no one release's file is read.
        means: what it says about the NaN, in one sentence.
        causes: the catalogued causes (causes.catalogue, causes.reported) it is evidence for.
    """

    id: str
    value: str
    quantity: str
    fatal: bool
    stack: str
    source: str
    means: str
    causes: tuple[str, ...] = ()


SIGNALS: tuple[Signal, ...] = (
    Signal(
        id="deepspeed-overflow",
        value="NaN or Inf",
        quantity="gradient",
        fatal=False,
        stack="deepspeed",
        source=f"{DEEPSPEED} deepspeed/runtime/fp16/loss_scaler.py:180-188; each wording's own source: WORDINGS",
        means="DeepSpeed's fp16 loss scaler found inf/NaN in the scaled gradients and skipped the step, lowering the scale "
        "(or spending its hysteresis); at the start of a run this is the scale calibrating, later a gradient that "
        "overflows fp16 step after step",
        causes=("activation-overflow", "backward-only-fault"),
    ),
    Signal(
        id="scaler-overflow",
        value="NaN or Inf",
        quantity="gradient",
        fatal=False,
        stack="-",
        source="each wording's own source: WORDINGS (apex, fairseq, ColossalAI, DeepSpeed's and apex's FP16_Optimizer)",
        means="a dynamic loss scaler found inf/NaN in the scaled gradients and skipped the step, lowering the scale: "
        "at the start of a run the scale calibrating, later a gradient that overflows fp16 step after step",
        causes=("activation-overflow", "backward-only-fault"),
    ),
    Signal(
        id="loss-scale-minimum",
        value="NaN or Inf",
        quantity="gradient",
        fatal=True,
        stack="deepspeed",
        source=f"{DEEPSPEED} deepspeed/runtime/fp16/loss_scaler.py:174-176",
        means="DeepSpeed's fp16 loss scale reached its minimum and the gradients still overflowed: every step for a while "
        "had inf/NaN gradients, not a calibration; the run ends",
        causes=("activation-overflow", "backward-only-fault", "bad-checkpoint-resume"),
    ),
    Signal(
        id="overflow-exit",
        value="NaN or Inf",
        quantity="gradient",
        fatal=True,
        stack="gpt-neox",
        source="gpt-neox v1.0 megatron/utils.py:338-358 (OverflowMonitor, n=50; v2.0 :361), megatron/training.py "
        "(overflow_monitor.check after each step)",
        means="the run's overflow monitor ended it: every one of the last steps it counts was skipped on inf/NaN "
        "gradients (the loss scaler overflowing step after step): persistent non-finite gradients, not a scale "
        "calibrating",
        causes=("activation-overflow", "backward-only-fault", "bad-checkpoint-resume"),
    ),
    Signal(
        id="anomaly-nan",
        value="NaN",
        quantity="backward",
        fatal=True,
        stack="torch",
        source="torch/csrc/autograd/python_anomaly_mode.cpp, engine.cpp (torch.autograd.set_detect_anomaly)",
        means="autograd's anomaly mode found a backward function that returned NaN: the first non-finite gradient is "
        "that function's output, and the forward op it belongs to is its input",
        causes=("backward-only-fault", "activation-overflow", "kl-exp-overflow", "ratio-exp-overflow"),
    ),
    Signal(
        id="anomaly-forward",
        value="-",
        quantity="backward",
        fatal=False,
        stack="torch",
        source="torch/csrc/autograd/python_anomaly_mode.cpp (the warning before the error)",
        means="autograd's anomaly mode traces the forward call of a backward function that raised (its NaN check, or "
        "any other error in the backward pass): the frames below it are the forward op's; the error line says which",
        causes=("backward-only-fault", "activation-overflow"),
    ),
    Signal(
        id="probability-assert",
        value="NaN or Inf",
        quantity="probabilities",
        fatal=True,
        stack="torch",
        source="aten/src/ATen/native/cuda/TensorCompare.cu (_assert_async), Distributions.cpp (multinomial)",
        means="torch.multinomial was given probabilities holding inf, NaN or a negative value: the sampling model's "
        "logits were non-finite (its weights after a NaN update, or an activation overflow)",
        causes=("activation-overflow", "nan-rollout-logprob", "bad-checkpoint-resume"),
    ),
    Signal(
        id="device-assert",
        value="-",
        quantity="index",
        fatal=True,
        stack="cuda",
        source="aten/src/ATen/native/cuda (a device-side assert)",
        means="a CUDA kernel's assert fired (an index out of range, a class id past the vocabulary); with NaN logits an "
        "argmax or a sampled id is garbage: the Python frames point where the error surfaced, not where it fired",
        causes=("activation-overflow",),
    ),
    Signal(
        id="nccl-timeout",
        value="-",
        quantity="collective",
        fatal=True,
        stack="nccl",
        source="torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (the watchdog)",
        means="a collective waited past its timeout on the ranks that report it: another rank never joined (it raised on "
        "a NaN, hung or died); the reporting ranks are the ones left waiting, not the one that failed",
        causes=("transient-fault",),
    ),
    Signal(
        id="skip-nonfinite-grad",
        value="NaN or Inf",
        quantity="gradient",
        fatal=False,
        stack="framework",
        source="each wording's own source: WORDINGS (verl, ColossalAI, the epfLLM Megatron-LLM fork)",
        means="the framework found the gradient norm non-finite and skipped the optimizer step: the gradients, not the "
        "weights, went non-finite on that step",
        causes=("backward-only-fault", "activation-overflow"),
    ),
    Signal(
        id="logged-nonfinite",
        value="NaN or Inf",
        quantity="metric",
        fatal=False,
        stack="tensorboard",
        source="tensorboardX x2num.py check_nan",
        means="TensorBoard's writer was given a NaN or Inf scalar to log: one of the logged metrics is non-finite",
    ),
    Signal(
        id="nonfinite-error",
        value="NaN or Inf",
        quantity="-",
        fatal=True,
        stack="-",
        source="",
        means="the run ended on an error whose message names a NaN or an Inf",
    ),
    Signal(
        id="nonfinite-message",
        value="NaN or Inf",
        quantity="-",
        fatal=False,
        stack="-",
        source="",
        means="the log says a loss or a gradient went NaN or Inf",
    ),
    Signal(
        id="bad-probs",
        value="NaN or Inf",
        quantity="probabilities",
        fatal=False,
        stack="-",
        source="a rollout sampler's own guard (`Bad probs detected: NaN: True`, RLinf-like)",
        means="a sampler's check found the sampling probabilities non-finite: the policy's logits at rollout were "
        "NaN or Inf (its weights after a NaN update, or an activation overflow); the probabilities, not a metric",
        causes=("activation-overflow", "nan-rollout-logprob", "bad-checkpoint-resume"),
    ),
    Signal(
        id="printed-tensor",
        value="NaN or Inf",
        quantity="-",
        fatal=False,
        stack="-",
        source="torch 2.x torch/_tensor_str.py (a tensor's repr: `tensor(nan, device='cuda:0', grad_fn=<...>)`)",
        means="a tensor the job's own code printed holds NaN or Inf: which value it is, its name says (on its line, or "
        "at the prompt before it), else the code that printed it",
    ),
    Signal(
        id="nanscope-report",
        value="NaN or Inf",
        quantity="model",
        fatal=False,
        stack="nanscope",
        source="nanscope's plugins: nanscope/verl_plugin/report.py:65-69, nanscope/slime_plugin/report.py:58-62",
        means="nanscope's plugin found a non-finite module output, gradient or loss and wrote its report (the "
        "first module, its micro-batch, the class of cause, then the rerun's verdict)",
        causes=("activation-overflow", "backward-only-fault", "transient-fault"),
    ),
    Signal(
        id="nanscope-cleaned",
        value="NaN or Inf",
        quantity="loss",
        fatal=False,
        stack="nanscope",
        source="nanscope's plugins: nanscope/slime_plugin/logs.py:69-71 (the warning's text), "
        "nanscope/verl_plugin/watch.py:274-275 and slime_plugin/logs.py:93-96 (its line)",
        means="nanscope's plugin found non-finite loss inputs (old or rollout log-probs, advantages, reference "
        "log-probs: the data, not the model) and replaced them, their tokens out of the loss; the step went on",
    ),
    Signal(
        id="nanscope-headroom",
        value="-",
        quantity="loss",
        fatal=False,
        stack="nanscope",
        source="nanscope's plugins: nanscope/slime_plugin/logs.py:40-60 (the warning's text), "
        "nanscope/verl_plugin/watch.py:274-275 and slime_plugin/logs.py:93-96 (its line)",
        means="a log-ratio the loss exponentiates came near or past fp32's exp overflow at 88.72 (nanscope's loss "
        "clamps it at +-20): without the clamp its exp is inf and the gradient NaN; the data or the policy drifted",
        causes=("activation-overflow",),
    ),
    Signal(
        id="out-of-memory",
        value="-",
        quantity="memory",
        fatal=True,
        stack="torch",
        source="torch 2.x c10/cuda/CUDACachingAllocator.cpp (the `CUDA out of memory. Tried to allocate` message, "
        "raised as torch.OutOfMemoryError, torch.cuda.OutOfMemoryError before torch 2.5)",
        means="the CUDA caching allocator could not allocate a tensor: the run ended on memory, not on a non-finite "
        "value",
    ),
)
BY_ID = {signal.id: signal for signal in SIGNALS}


@dataclass(frozen=True)
class Wording:
    """One wording of an evidence line, and whose code prints it (a wording several stacks print names none of them).

    Attributes:
        id: its one spelling.
        signal: the Signal it is evidence of.
        example: the line, as printed.
        stacks: the software whose code prints it (facts.frameworks names where it is one, else the project's name).
        source: where, "<project> <release> <file>:<line>" for each.
        printed_by: whose words, as a reader would say it.
        value: what it says was non-finite ("NaN or Inf": a check that counts both, whatever its words).
    """

    id: str
    signal: str
    example: str
    stacks: tuple[str, ...]
    source: str
    printed_by: str = ""
    value: str | None = None
    model: str | None = None  # the one model whose update prints it (verl's actor names its rank, its critic none)


WORDINGS: tuple[Wording, ...] = (
    Wording(
        id="deepspeed-overflow-rank",
        signal="deepspeed-overflow",
        example="[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        stacks=("deepspeed",),
        source=f"{DEEPSPEED} deepspeed/runtime/fp16/loss_scaler.py:180-188 (logger.info, rank 0 only)",
        printed_by="DeepSpeed's loss scaler",
    ),
    Wording(
        id="deepscale-overflow",
        signal="deepspeed-overflow",
        example="[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648.0",
        stacks=("deepspeed", "colossalai"),
        source="DeepSpeed v0.3.0 .. v0.6.0 deepspeed/runtime/zero/stage2.py, stage3.py, stage_1_and_2.py (logger.info: "
        "LOGGER_FILES); ColossalAI v0.0.2 "
        "colossalai/zero/zero_redundancy_optimizer_level_3.py:2885-2889 (print on rank 0: its copy of DeepSpeed's ZeRO)",
        printed_by="DeepSpeed's ZeRO (0.3 to 0.6) and ColossalAI 0.0.x's copy of it, which print the same words",
    ),
    Wording(
        id="deepspeed-overflow-plain",
        signal="deepspeed-overflow",
        example="[deepspeed] OVERFLOW! Skipping step. Attempted loss scale: 1024, reducing to 512",
        stacks=("deepspeed",),
        source="DeepSpeed v0.3.10 deepspeed/runtime/fp16/fused_optimizer.py:156, unfused_optimizer.py:142, :168, "
        "zero/stage1.py:633",
        printed_by="DeepSpeed's FP16 optimizers",
    ),
    Wording(
        id="deepspeed-dynamic-overflow",
        signal="deepspeed-overflow",
        example="[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: 1024, reducing to 512",
        stacks=("deepspeed",),
        source="DeepSpeed edaa722 deepspeed/runtime/fp16/fused_optimizer.py:171, unfused_optimizer.py:155, :203",
        printed_by="DeepSpeed's FP16 optimizers",
    ),
    Wording(
        id="overflow-detected",
        signal="deepspeed-overflow",
        example="[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 1, reducing to 1",
        stacks=("deepspeed",),
        source="DeepSpeed v0.3.10 deepspeed/runtime/fp16/fused_optimizer.py:218-221 (log_dist); edaa722 :268-271",
        printed_by="DeepSpeed's FP16_Optimizer",
    ),
    Wording(
        id="grad-overflow-iteration",
        signal="scaler-overflow",
        example="Grad overflow on iteration 8",
        stacks=("deepspeed", "apex"),
        source="DeepSpeed v0.3.10 deepspeed/runtime/fp16/fused_optimizer.py:314, edaa722 :406, :419, unfused_optimizer.py"
        ":281, :294 (logger.info, after a `[fused_optimizer.py:N:_update_scale]` prefix); apex 25.09 "
        "apex/contrib/optimizers/fp16_optimizer.py:151, :160 (print)",
        printed_by="DeepSpeed's FP16_Optimizer and apex contrib's, which print the same words",
    ),
    Wording(
        id="apex-amp-overflow",
        signal="scaler-overflow",
        example="Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
        stacks=("apex",),
        source="apex before cb65b8ed (where amp was removed) apex/amp/handle.py:138",
        printed_by="apex amp",
    ),
    Wording(
        id="fairseq-overflow",
        signal="scaler-overflow",
        example="NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0",
        stacks=("fairseq",),
        source="fairseq 3d262bb fairseq/trainer.py:1013 (with fairseq/optim/dynamic_loss_scaler.py:70)",
        printed_by="fairseq's trainer",
    ),
    Wording(
        id="colossalai-found-overflow",
        signal="scaler-overflow",
        example="Found overflow. Skip step",
        stacks=("colossalai",),
        source="ColossalAI 4f9953b colossalai/zero/low_level/low_level_optim.py:534, zero/gemini/gemini_optimizer.py:277",
        printed_by="ColossalAI's ZeRO and Gemini optimizers",
    ),
    Wording(
        id="colossalai-found-inf",
        signal="skip-nonfinite-grad",
        example="WARNING: found inf during ShardedOptimV2 step",
        stacks=("colossalai",),
        source="ColossalAI v0.1.10 colossalai/zero/sharded_optim/sharded_optim_v2.py:197 (found_inf: isinf or isnan of a "
        "gradient, zero/sharded_model/sharded_model_v2.py:364-365)",
        printed_by="ColossalAI's ShardedOptimizerV2",
        value="NaN or Inf",
    ),
    Wording(
        id="verl-actor-not-finite",
        signal="skip-nonfinite-grad",
        example="WARN: rank 0 grad_norm is not finite: inf",
        stacks=("verl",),
        source="verl v0.7.1 verl/workers/actor/dp_actor.py:409-412 (the actor's optimizer step; its critic's line, "
        "dp_critic.py:145-146, names no rank)",
        printed_by="verl's FSDP actor",
        model="actor",
    ),
    Wording(
        id="verl-not-finite",
        signal="skip-nonfinite-grad",
        example="WARN: grad_norm is not finite: nan",
        stacks=("verl",),
        source="verl v0.9.0 verl/workers/engine/fsdp/transformer_impl.py:793-795 (any model's engine); v0.7.1 "
        "verl/workers/critic/dp_critic.py:145-146 (the critic's)",
        printed_by="verl's FSDP engine or critic",
    ),
    Wording(
        id="gpt-neox-overflow-monitor",
        signal="overflow-exit",
        example="Exception: Skipped 50 iterations in a row due to Overflow - Exiting training.",
        stacks=("gpt-neox",),
        source="gpt-neox v1.0 megatron/utils.py:358 (OverflowMonitor.check: raise Exception)",
        printed_by="gpt-neox's OverflowMonitor",
    ),
    Wording(
        id="wenet-infinite-grad-norm",
        signal="skip-nonfinite-grad",
        example="WARNING get infinite grad_norm, check your code/data if it appears frequently",
        stacks=("cosyvoice", "wenet"),
        source="CosyVoice ace7c47 cosyvoice/utils/train_utils.py:305-315 (update_parameter_and_lr: `if "
        "torch.isfinite(grad_norm)` steps the optimizer, else this warning and no step), wenet's executor's words",
        printed_by="CosyVoice's (and wenet's) trainer",
        value="NaN or Inf",
    ),
    Wording(
        id="dle-loss-scale-parameter",
        signal="scaler-overflow",
        example="DLL 2020-05-28 08:53:10.435230 - PARAMETER loss_scale : 524288.0",
        stacks=("apex",),
        source="NVIDIA DeepLearningExamples 9df464f2 (May 2020, apex amp) PyTorch/LanguageModeling/BERT/"
        "run_pretraining.py:457-465 (take_optimizer_step: on an overflow no optimizer.step, the scaler's new loss_scale "
        "logged as a DLLogger PARAMETER, main process only); 729963dd :728-729 (when `skip_optimizer_step` > 0)",
        printed_by="NVIDIA DeepLearningExamples' BERT trainer (DLLogger, apex amp's loss scaler)",
    ),
    Wording(
        id="megatron-llm-bad-grad-norm",
        signal="skip-nonfinite-grad",
        example="***WARNING*** Bad grad_norm detected (grad_norm=nan)",
        stacks=("megatron-lm",),
        source="epfLLM/Megatron-LLM (a Megatron-LM fork) 806a833 megatron/optimizer/optimizer.py:442-444, :753-755 (a "
        "non-finite clipped norm skips the step)",
        printed_by="the epfLLM Megatron-LLM fork of Megatron-LM",
    ),
    Wording(
        id="nanscope-verl-report",
        signal="nanscope-report",
        example="nanscope: rank 1: non-finite values in the actor's update 0 mini-batch 0: "
        "nanscope_reports/rollout0_step0_rank1.json; to replay the loss offline: nanscope trace ...",
        stacks=("verl",),
        source="nanscope/verl_plugin/report.py:65-69 (nanscope.verl_plugin, inside verl's worker)",
        printed_by="nanscope's verl plugin",
    ),
    Wording(
        id="nanscope-slime-report",
        signal="nanscope-report",
        example="nanscope: rank 1: non-finite values at rollout 3 step 0: nanscope_reports/rollout3_step0_rank1.json; ...",
        stacks=("slime",),
        source="nanscope/slime_plugin/report.py:58-62 (nanscope.slime_plugin, inside slime's train step)",
        printed_by="nanscope's slime plugin",
    ),
    Wording(
        id="nanscope-verl-warning",
        signal="nanscope-cleaned",
        example="nanscope: warning: actor update 0 mini-batch 0: 1 non-finite loss input entries (log-probs or "
        "advantages)",
        stacks=("verl",),
        source="nanscope/verl_plugin/watch.py:274-275 (nanscope.verl_plugin, inside verl's worker)",
        printed_by="nanscope's verl plugin",
    ),
    Wording(
        id="nanscope-slime-warning",
        signal="nanscope-cleaned",
        example="nanscope: warning: rollout 3 step 0: nanscope/max_ppo_log_ratio = 95.21 > 60: past fp32's exp "
        "overflow at 88.72 by 6.49 (PPO log-ratio logp - old)",
        stacks=("slime",),
        source="nanscope/slime_plugin/logs.py:93-96 (nanscope.slime_plugin, inside slime's train step)",
        printed_by="nanscope's slime plugin",
    ),
)  # fmt: skip

WORDING = {wording.id: wording for wording in WORDINGS}

# DeepSpeed's logger prefix (`[INFO] [stage3.py:2323:_overflow_clean_up]`) names the file that printed an overflow
# line, and so the optimizer: file -> (whose words, where; for `[deepscale] OVERFLOW!` the releases whose file printed
# those words). Read from DeepSpeed's tags v0.3.0 .. v0.19.5.
LOGGER_FILES = {
    "stage2.py": ("DeepSpeed's ZeRO stage 2", "DeepSpeed v0.3.0 .. v0.3.11 deepspeed/runtime/zero/stage2.py:1352-1360 "
                  "(and v0.5.8 :1632)"),
    "stage3.py": ("DeepSpeed's ZeRO stage 3", "DeepSpeed v0.3.12 .. v0.6.0 deepspeed/runtime/zero/stage3.py "
                  "(_overflow_clean_up; v0.4.0 :2697, v0.6.0 :2554)"),
    "stage_1_and_2.py": ("DeepSpeed's ZeRO stage 1 and 2", "DeepSpeed v0.5.9 .. v0.6.0 "
                         "deepspeed/runtime/zero/stage_1_and_2.py:1632-1653"),
    "loss_scaler.py": ("DeepSpeed's loss scaler", f"{DEEPSPEED} deepspeed/runtime/fp16/loss_scaler.py:180-188"),
    "fused_optimizer.py": ("DeepSpeed's FP16_Optimizer", "DeepSpeed deepspeed/runtime/fp16/fused_optimizer.py"),
    "unfused_optimizer.py": ("DeepSpeed's FP16_UnfusedOptimizer", "DeepSpeed deepspeed/runtime/fp16/unfused_optimizer.py"),
}  # fmt: skip
