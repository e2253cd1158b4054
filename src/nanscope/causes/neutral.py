"""Each catalogued hazard's observation in words any framework's job can act on (no slime flag, no slime plugin).

The catalogue's discriminators (causes.catalogue) name slime's flags and nanscope's slime plugin; a job of another
framework (verl, TRL, DeepSpeed, Megatron-LM, ...) gets these instead.
"""

from __future__ import annotations

from nanscope.facts import frameworks

DISCRIMINATORS: dict[str, str] = {
    "kl-exp-overflow": "the KL term on the failing step: an exp of a log-ratio past 88.7 overflows fp32 (a kl metric "
    "far from 0 on the steps before)",
    "ratio-exp-overflow": "the importance ratio's log on the failing step: past 88.7 its exp overflows fp32 (a "
    "ppo_kl or clip-fraction metric far from 0 on the steps before)",
    "nan-rollout-logprob": "the rollout batch's log-probs: a non-finite one names the sample and the token",
    "nan-reward": "the rollout batch's rewards: a non-finite reward names the sample",
    "zero-temperature": "the sampling temperature the rollout engine uses: 0 divides the logits by zero",
    "rollout-logprob-shift": "the rollout engine's and the trainer's log-probs of the same tokens: a large gap (an "
    "importance weight far above its clip)",
    "activation-overflow": "a rerun of the failing step with forward hooks: the first module whose output is "
    "non-finite",
    "backward-only-fault": "autograd's anomaly mode (torch.autograd.set_detect_anomaly) on a rerun of the failing "
    "step: the backward function that returned NaN first, every forward output finite",
    "transient-fault": "the failing step rerun on the same GPU and on another: finite on a rerun is a fault of the "
    "device",
    "logprob-drift": "the KL and log-ratio metrics' trend: rising step by step before the NaN",
    "moe-aux-loss": "the router's auxiliary and z-loss values on the failing step, then a backward hook on the "
    "router: its gradient the first non-finite one",
    "moe-zero-token-expert": "the tokens each expert received on the failing micro-batch: an expert with 0 tokens "
    "whose gradient is the first non-finite one",
    "moe-router-logits": "a forward hook on each router: the first non-finite output a router's logits, every "
    "module before it finite",
    "cpu-offloaded-optimizer": "the parameters after a step with finite gradients: non-finite ones; the step rerun "
    "with the optimizer on the device",
    "bad-checkpoint-resume": "the first step after the load: non-finite (or its gradient norm far out of range) there "
    "and not on a fresh start from the same weights",
}


# A job without megatron-core: no TransformerEngine of Megatron's, no RerunStateMachine, and a loss that is torch's
LIBRARIES = "the versions of torch, CUDA and the attention kernels the model calls (flash-attention, xformers)"
LIBRARY_REGRESSION = (
    "the failing step rerun on the same GPU and on another (finite on another: the device), then a bisect over the "
    "torch / CUDA / attention-kernel versions on the saved step"
)
# torch's cross_entropy averages over the targets not ignored: none makes 0/0 (measured: F.cross_entropy(logits,
# torch.full((4,), -100)) is nan, and the logits' gradient 0, torch 2.13 CPU)
ALL_MASKED = (
    "a batch whose every label is masked (-100: padding, or a prompt longer than the cut) has no token to average "
    "over: torch's cross_entropy (reduction 'mean') is 0/0, NaN, on it, and its gradient 0 (a NaN loss beside a "
    "finite gradient norm)"
)
PADDING_ONLY = "a micro-batch of padding only has no tokens to divide by"
_MASK_SUM = PADDING_ONLY + ": its loss is the masked sum over loss_mask.sum(), unclamped ({})"
# framework -> how its loss divides by a token count that an empty batch makes 0 (frameworks.MEGATRON_COPIES, mlx-lm)
EMPTY_BATCH = {
    frameworks.MEGATRON_DEEPSPEED: _MASK_SUM.format("microsoft/Megatron-DeepSpeed 0782d75 pretrain_gpt.py:158-162"),
    frameworks.GPT_NEOX: _MASK_SUM.format("EleutherAI/gpt-neox 557751f megatron/model/gpt2_model.py:52-69"),
    frameworks.MLX_LM: "a batch with no target tokens: mlx-lm's fine-tuning loss is the masked sum over its token "
    "count, unclamped (ml-explore/mlx-lm 00e8dc2 mlx_lm/tuner/trainer.py:70-81; another trainer's loss is its own)",
}
# mlx-lm trains on MLX, not torch: its kernels are MLX's
MLX_LIBRARIES = "the versions of MLX and mlx-lm"


def neutral(found: list) -> None:
    """Each candidate (launch.candidates.Candidate) of a non-slime job with the observation in any framework's words."""
    for candidate in found:
        if candidate.discriminator is not None and candidate.id in DISCRIMINATORS:
            candidate.discriminator = DISCRIMINATORS[candidate.id]
