"""NaN and Inf evidence other than Megatron's own check: the lines other stacks print when a value goes non-finite.

Each record says what the line means, what it rejected or skipped, whether the run ends there, where the words are
printed (file:line at a release nanscope read), and the catalogued causes it supports. The reader is
launch.signals; the words are matched there.

    deepspeed-overflow     DeepSpeed's fp16 loss scaler: a step with inf/NaN gradients skipped, the scale lowered
    loss-scale-minimum     ... the scale already at its minimum and still overflowing: the run ends
    anomaly-nan            PyTorch's anomaly mode: a backward function returned NaN (which one, which output)
    anomaly-forward        ... the warning before it, naming the backward function whose forward is traced
    probability-assert     torch.multinomial (sampling): the probabilities hold inf, NaN or a negative value
    device-assert          a CUDA device-side assert (an index out of range: what NaN logits make of an argmax)
    nccl-timeout           a collective waited past its timeout: a rank left it (one that hit a NaN, or died)
    skip-nonfinite-grad    a framework skipped the optimizer step on a non-finite gradient norm (verl, ColossalAI)
    logged-nonfinite       TensorBoard's writer refused a non-finite scalar
    nonfinite-error        any other error line whose message names NaN or Inf
    nonfinite-message      any other log line that says a loss or gradient is NaN or Inf
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
        quantity: where: "gradient", "loss", "probabilities", "backward", "collective", "index", "metric".
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
        source=f"{DEEPSPEED} deepspeed/runtime/fp16/loss_scaler.py:180-188 (and fused_optimizer.py:266, unfused_optimizer.py"
        ":160)",
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
        source="apex amp (scaler.py), fairseq (fp16_optimizer.py), ColossalAI's mixed precision: their own words",
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
        value="NaN",
        quantity="backward",
        fatal=False,
        stack="torch",
        source="torch/csrc/autograd/python_anomaly_mode.cpp (the warning before the error)",
        means="autograd's anomaly mode traces the forward call of the backward function that failed: the frames below "
        "it are the forward op's",
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
        source="verl v0.9.0 verl/workers/engine/fsdp/transformer_impl.py:793-795; ColossalAI sharded_optim_v2.py",
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
)
BY_ID = {signal.id: signal for signal in SIGNALS}
