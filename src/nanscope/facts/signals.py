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
    none-logprob           a rollout engine's NaN log-prob written as None, which the trainer's torch.tensor refuses (TRL)
    device-assert          a CUDA device-side assert (an index out of range: what NaN logits make of an argmax)
    nccl-timeout           a collective waited past its timeout: a rank left it (one that hit a NaN, or died)
    skip-nonfinite-grad    a framework skipped the optimizer step on a non-finite gradient norm (verl, ColossalAI, ESPnet)
    logged-nonfinite       TensorBoard's writer refused a non-finite scalar
    nonfinite-error        any other error line whose message names NaN or Inf
    nonfinite-message      any other log line that says a loss or gradient is NaN or Inf
    printed-tensor         a tensor printed by the job's own code (`tensor(nan, device='cuda:0')`) holds NaN or Inf
    unnamed-values         a logged row of values no name labels holds NaN or Inf (a loop printing its terms in columns)
    nanscope-report        nanscope's own plugin (verl's or slime's) found a non-finite step and wrote its report
    nanscope-cleaned       ... replaced non-finite loss inputs (the data's) and took their tokens out of the loss
    nanscope-headroom      ... saw a log-ratio the loss exponentiates near or past fp32's exp overflow (88.72)
    out-of-memory          torch's CUDA allocator ran out of memory: the run ended, and on no NaN or Inf
"""

from __future__ import annotations

from dataclasses import dataclass

# DeepSpeed's release most lines are read at; each wording of an evidence line, whose code prints it
from nanscope.facts.evidence_wordings import DEEPSPEED, WORDING, WORDINGS, Wording  # noqa: F401 (facts.signals' names)


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
        "(or spending its hysteresis); at the start of a run this is the scale calibrating, mid-run one overflow after "
        "a window of clean steps is the scaler probing a higher scale, and overflow after overflow is a gradient that "
        "overflows fp16 at every scale it tries",
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
        "at the start of a run the scale calibrating, mid-run one overflow after a window of clean steps the scaler "
        "probing a higher scale, and overflow after overflow a gradient that overflows fp16 at every scale it tries",
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
        "any other error in the backward pass): the frames below it are the forward op's; the error line after them "
        "(where the text has it) says which",
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
        id="none-logprob",
        value="NaN",
        quantity="probabilities",
        fatal=True,
        stack="trl",
        source="trl v0.29.0 trl/generation/vllm_generation.py:91 (v1.1.0 :88, extract_logprobs: colocated, and the "
        "server's /generate/ through it, trl/scripts/vllm_serve.py:649) writes vLLM's NaN log-prob as None; v1.1.0 "
        "trl/trainer/grpo_trainer.py:1991 (_generate_and_score_completions: torch.tensor on each completion's list "
        "raises on it)",
        means="vLLM returned a NaN log-prob for a token it sampled, which TRL writes as None (else a custom rollout_func "
        "returned a None log-prob), and the trainer's torch.tensor on the completion's log-probs raised: the rollout "
        "engine's logits for that token were NaN or +Inf (the policy's weights as synced to it, a corrupted sync "
        "among them, or an activation overflow in the engine)",
        causes=("activation-overflow", "nan-rollout-logprob", "transient-fault", "bad-checkpoint-resume"),
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
        source="each wording's own source: WORDINGS (verl, ColossalAI, the epfLLM Megatron-LLM fork, ESPnet2)",
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
        id="unnamed-values",
        value="NaN or Inf",
        quantity="metric",
        fatal=False,
        stack="-",
        source="the line's own values (isl-org/PhotorealismEnhancement#66: a row of fixed-width terms, `----` for "
        "those not computed that iteration)",
        means="a logged row of values that no name labels holds NaN or Inf: a metric went non-finite, and the line "
        "does not say which",
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
