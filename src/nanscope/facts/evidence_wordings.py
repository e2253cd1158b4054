"""Each wording of another stack's NaN or Inf evidence line (facts.signals), and whose code prints it, with the
release, file and line: one spelling a wording, its signal, the line as printed, the stacks that print it.

    WORDING["deepspeed-overflow-rank"].printed_by     # "DeepSpeed's loss scaler" ...
"""

from __future__ import annotations

from dataclasses import dataclass

DEEPSPEED = "DeepSpeed 0.16.4"  # the release most wordings (and facts.signals' lines) are read at


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
        id="guided-diffusion-found-nan",
        signal="scaler-overflow",
        example="Found NaN, decreased lg_loss_scale to -16199.354",
        stacks=("guided-diffusion", "improved-diffusion"),
        source="guided-diffusion 22e0df8 guided_diffusion/fp16_util.py:192-195 (from 20.0, :12); improved-diffusion "
        "1bc7bbb improved_diffusion/train_util.py:231",
        printed_by="guided-diffusion's fp16 trainer (improved-diffusion's prints the same words)",
    ),
    Wording(
        id="espnet-skipping-update",
        signal="skip-nonfinite-grad",
        example="(trainer:581) WARNING: The grad norm is nan. Skipping updating the model.",
        stacks=("espnet", "funasr"),
        source="espnet 202412 espnet2/train/trainer.py:710-713; FunASR 1.1.0 funasr/train_utils/trainer.py:438, "
        "trainer_ds.py:706",
        printed_by="ESPnet2's trainer (FunASR's prints the same words)",
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
        id="icefall-grad-scale-small",
        signal="scaler-overflow",
        example="WARNING [train.py:1057] (2/4) Grad scale is small: 1.2924697071141057e-26",
        stacks=("icefall",),
        source="k2-fsa/icefall 36e0420 egs/librispeech/ASR/zipformer/train.py:1168-1183 (train_one_epoch: torch's "
        "GradScaler scale `scaler._scale`, halved on each step whose gradients hold inf or NaN; below 0.01 this "
        "warning, below 1e-05 icefall/err.py's `grad_scale is too small, exiting: ...`)",
        printed_by="the recipes of icefall (and the trainers derived from them)",
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
        id="trl-none-logprob",
        signal="none-logprob",
        example="    sampling_per_token_logps = [torch.tensor(logps) for logps in sampling_per_token_logps_list]\n"
        "RuntimeError: Could not infer dtype of NoneType",
        stacks=("trl",),
        source="trl v1.1.0 trl/trainer/grpo_trainer.py:1991 (v1.0.0 :1779; v0.29.0 :1655 with device=device), the "
        "None from trl/generation/vllm_generation.py:88",
        printed_by="TRL's GRPO trainer (and its experimental GFPO, DPPO and replay-buffer variants)",
        value="NaN",
        model="policy",  # the log-probs of the policy's completions, as vLLM sampled them
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
