"""The frameworks whose Megatron NaN reports doctor reads, and what names each in a traceback or a log.

A frame's path names its framework by a directory of that framework's package (`PATHS`); a log line by a text only
that framework prints (`TEXTS`: a Ray actor's class, a log prefix). The RL frameworks call Megatron-LM and
megatron-core, so a traceback holds frames of several: the first of `NAMES` with evidence is the job's.

    from nanscope.facts.frameworks import NAMES, PATHS
"""

from __future__ import annotations

import re

SLIME, MEGATRON_LM, NEMO, NEMO_RL, VERL, OPENRLHF, ROLL, MS_SWIFT, PAI, UNKNOWN = (
    "slime", "megatron-lm", "nemo", "nemo-rl", "verl", "openrlhf", "roll", "ms-swift", "pai-megatron-patch", "unknown",
)  # fmt: skip
# The stacks outside Megatron whose NaN reports doctor reads too (their evidence lines and metric lines).
LLAMA_FACTORY, TRL, DPO_REFERENCE, DEEPSPEED_CHAT, INTERNEVO, XTUNER, MMENGINE, COLOSSALAI, COMPOSER, LIGHTNING = (
    "llama-factory", "trl", "dpo-reference", "deepspeed-chat", "internevo", "xtuner", "mmengine", "colossalai",
    "composer", "lightning",
)  # fmt: skip
MEGATRON_DEEPSPEED, NANOGPT, TRANSFORMERS, DEEPSPEED = "megatron-deepspeed", "nanogpt", "transformers", "deepspeed"
# issue 41's third round: gpt-neox (a Megatron-LM copy trained with DeepSpeed), Lightning's lit-llama and litgpt,
# Meta's llama-recipes, OpenMMLab's mmcv runner (before mmengine)
GPT_NEOX, LIT_LLAMA, LITGPT, LLAMA_RECIPES, MMCV = "gpt-neox", "lit-llama", "litgpt", "llama-recipes", "mmcv"
TORCHTUNE = "torchtune"
UNSLOTH, AXOLOTL = "unsloth", "axolotl"  # issue 41's thirteenth round: trainers over transformers and TRL
TORCHTITAN = "torchtitan"  # issue 41's twelfth round (pytorch/torchtitan: run_train.sh, torchtitan/train.py)
# issue 41's sixteenth round: RLinf (RLinf/RLinf: Ray workers under rlinf/workers/, FSDP or Megatron backends)
RLINF = "rlinf"
# issue 41's nineteenth round: AMD's Primus, a launcher over Megatron-LM, TorchTitan or JAX (AMD-AGI/Primus fd1eeab
# primus/cli/main.py:145), whose CLI prints a failed run's error as `[Primus] Error: ...` (:220)
PRIMUS = "primus"
# issue 41's twenty-second round: NeMo AutoModel, NeMo's PyTorch DTensor-native trainer of Hugging Face models (FSDP2,
# its own recipes: NVIDIA-NeMo/Automodel nemo_automodel/recipes/{llm,vlm}/...), no megatron-core DDP
NEMO_AUTOMODEL = "nemo-automodel"
# NeMo 0.x, the neural-modules API of 2019-2020 (NVIDIA/NeMo 6a687a1 nemo/backends/pytorch/actions.py: its train loop
# skips a step on a NaN loss, `Loss is NaN or inf. Skipping update.`; nemo/core/neural_factory.py), years before
# megatron-core: none of its causes are this job's
NEMO_0 = "nemo-0.x"
# issue 41's thirtieth round: Apple's mlx-lm, whose tuner trains on MLX (ml-explore/mlx-lm 00e8dc2
# mlx_lm/tuner/trainer.py: `Iter {it}: Train loss ...`, `Iter {it}: Val loss ...`, `Saved final weights to ...`)
MLX_LM = "mlx-lm"
FAIRSEQ = "fairseq"  # issue 41's sixteenth round: fairseq's `| epoch 027 | loss 6.343 | ... | num_updates 10198 |`
# In order of precedence: a job's own framework before the libraries it calls (NeMo's recipes and ms-swift call
# Megatron-LM's training loop; every one of them calls megatron-core; TRL and LLaMA-Factory call transformers'
# Trainer, which calls DeepSpeed).
NAMES = (
    SLIME, VERL, OPENRLHF, NEMO_RL, ROLL, RLINF, MS_SWIFT, PAI, PRIMUS, NEMO_AUTOMODEL, NEMO_0, NEMO, LLAMA_FACTORY, UNSLOTH, AXOLOTL, TRL, DPO_REFERENCE,
    DEEPSPEED_CHAT, INTERNEVO, XTUNER, MMENGINE, MMCV, COLOSSALAI, COMPOSER, LIT_LLAMA, LITGPT, LIGHTNING,
    LLAMA_RECIPES, GPT_NEOX, TORCHTUNE, TORCHTITAN, FAIRSEQ, MLX_LM, MEGATRON_DEEPSPEED, MEGATRON_LM, NANOGPT, TRANSFORMERS, DEEPSPEED,
    UNKNOWN,
)  # fmt: skip
# The stacks that train without megatron-core: its DDP, schedules and optimizer causes are not theirs.
WITHOUT_MEGATRON = (LLAMA_FACTORY, TRL, DPO_REFERENCE, DEEPSPEED_CHAT, INTERNEVO, XTUNER, MMENGINE, COLOSSALAI,
                    COMPOSER, LIGHTNING, NANOGPT, TRANSFORMERS, DEEPSPEED, GPT_NEOX, LIT_LLAMA, LITGPT, LLAMA_RECIPES,
                    MMCV, TORCHTUNE, TORCHTITAN, UNSLOTH, AXOLOTL, FAIRSEQ, NEMO_AUTOMODEL, NEMO_0,
                    MEGATRON_DEEPSPEED, MLX_LM)  # fmt: skip
# Megatron-DeepSpeed trains a Megatron-LM copy with DeepSpeed's engine: its MoE is DeepSpeed's (microsoft/Megatron-
# DeepSpeed 066632b megatron/model/transformer.py:32, `from deepspeed.moe.layer import MoE`), its megatron/core a
# partial copy (tensor_parallel, pipeline_parallel) without megatron-core's router, DDP or distributed optimizer

# Stacks nanscope does not catalogue but names by their own lines (Framework.stack): their evidence wordings
# (facts.evidence_wordings) and rsl-rl's `Learning iteration N/M` block (launch.line_shapes). Their models read no
# tokens: a diffusion model's loss is a mean over each image's pixels (guided-diffusion 22e0df8
# guided_diffusion/gaussian_diffusion.py:809, nn.py:86 mean_flat), rsl-rl's PPO losses means over a mini-batch of a
# simulator's transitions (leggedrobotics/rsl_rl 010cd22 rsl_rl/algorithms/ppo.py: surrogate_loss and value_loss,
# `.mean()`): no loss of theirs divides by a count of tokens that a batch of padding makes 0.
RSL_RL, GUIDED_DIFFUSION, IMPROVED_DIFFUSION = "rsl-rl", "guided-diffusion", "improved-diffusion"
TOKEN_FREE = {
    RSL_RL: "rsl-rl's PPO trains a policy and its critic on a simulator's observations",
    GUIDED_DIFFUSION: "guided-diffusion trains an image diffusion model",
    IMPROVED_DIFFUSION: "improved-diffusion trains an image diffusion model",
}
DIFFUSERS = "diffusers"  # Hugging Face diffusers' training scripts: an MSE over latents (or noise), no tokens
TOKEN_FREE[DIFFUSERS] = "diffusers trains an image diffusion model"
# their packages, as a frame's path under site-packages names them
STACK_PACKAGES = {"rsl_rl": RSL_RL, "guided_diffusion": GUIDED_DIFFUSION, "improved_diffusion": IMPROVED_DIFFUSION,
                  "diffusers": DIFFUSERS}  # fmt: skip

# framework -> its release as its own lines print it (Unsloth's banner: `==((====))==  Unsloth 2026.5.8: Fast Qwen2
# patching. Transformers: 4.57.6.`)
PRINTED_RELEASES = {UNSLOTH: re.compile(r"==\(\(====\)\)==\s{1,4}Unsloth (?P<release>\d{4}\.\d{1,2}\.\d{1,3})\b")}

# Megatron-LM copies trained by DeepSpeed's engine: no megatron-core, but Megatron-LM's TP/PP layout and its loss (a
# masked sum over loss_mask.sum(): causes.neutral.EMPTY_BATCH)
MEGATRON_COPIES = (MEGATRON_DEEPSPEED, GPT_NEOX)

# The jobs that run Megatron-LM's training loop (Pai-Megatron-Patch's and ms-swift's Megatron backend call its
# pretrain; Primus launches it) or Megatron-Bridge's (NeMo 2): started by torchrun or Slurm, ranks filling the nodes in
# order, and the RerunStateMachine's iteration theirs (core_v0.15.0rc0 megatron/training/training.py train_step;
# NVIDIA-NeMo/Megatron-Bridge 067f987 src/megatron/bridge/training/train.py:876 should_run_forward_backward)
MEGATRON_LOOP = (MEGATRON_LM, PAI, MS_SWIFT, NEMO, PRIMUS)

# Megatron-LM's training loop never runs DeepSpeed (core_v0.15.0rc0 megatron/training/ imports no `deepspeed`: its
# optimizer and loss scaler are megatron-core's); Megatron-DeepSpeed runs a copy of that loop on DeepSpeed's engine
# (deepspeedai/Megatron-DeepSpeed 4efb479 megatron/training.py:55 `import deepspeed`, :504 deepspeed.initialize). So
# Megatron-LM's evidence beside the engine's (the lines DeepSpeed's logger prints from these files, `[INFO]
# [stage_1_and_2.py:1644:step] ...`, or frames under this directory) is Megatron-DeepSpeed's (holdout23 05).
DEEPSPEED_ENGINE_FILES = ("stage2.py", "stage3.py", "stage_1_and_2.py", "engine.py", "loss_scaler.py",
                          "fused_optimizer.py", "unfused_optimizer.py", "bf16_optimizer.py")  # fmt: skip
DEEPSPEED_ENGINE_PATH = "/deepspeed/runtime/"

# The stacks whose jobs have rollouts, rewards and a policy loss (RL, preference training): the catalogue's batch
# causes (a KL's exp, a reward's NaN, a sampling temperature) are theirs to weigh; a pretraining or fine-tuning stack
# has none of them.
WITH_ROLLOUTS = (
    SLIME,
    VERL,
    OPENRLHF,
    NEMO_RL,
    ROLL,
    RLINF,
    MS_SWIFT,
    LLAMA_FACTORY,
    TRL,
    DPO_REFERENCE,
    DEEPSPEED_CHAT,
)

# LLaMA-Factory's entry script from v0.0.9 (LLaMA-Efficient-Tuning, its name then) to v0.7.0, replaced by
# `llamafactory-cli` in v0.7.1 (hiyouga/LLaMA-Factory 6261fb3 added src/train_bash.py, ce8200a removed it): a launch
# script that runs it, or a frame in it, is LLaMA-Factory's (its copies, Llama-Chinese's, are its code)
LLAMA_FACTORY_ENTRY = "/train_bash.py"
# framework -> directories (with their slashes) one of its frames' paths holds, or a file only it has
PATHS: dict[str, tuple[str, ...]] = {
    SLIME: ("/slime/backends/", "/slime/ray/", "/slime/utils/", "/slime/rollout/", "/slime_plugins/"),
    VERL: ("/verl/workers/", "/verl/trainer/", "/verl/single_controller/", "/verl/utils/", "/verl/models/"),
    OPENRLHF: ("/openrlhf/",),
    NEMO_RL: ("/nemo_rl/",),
    ROLL: ("/roll/pipeline/", "/roll/distributed/", "/roll/models/", "/roll/utils/"),
    RLINF: ("/rlinf/workers/", "/rlinf/scheduler/", "/rlinf/algorithms/"),
    PRIMUS: ("/primus/core/", "/primus/backends/", "/primus/cli/"),
    MS_SWIFT: ("/swift/megatron/", "/swift/cli/", "/swift/llm/", "/swift/trainers/"),
    PAI: ("/megatron_patch/",),
    NEMO_AUTOMODEL: ("/nemo_automodel/",),
    NEMO_0: ("/nemo/backends/", "/nemo/core/neural_factory.py", "/nemo/core/neural_modules.py"),
    NEMO: ("/nemo/lightning/", "/nemo/collections/", "/megatron/bridge/", "/nemo/core/"),
    LLAMA_FACTORY: ("/llamafactory/", "/llmtuner/", LLAMA_FACTORY_ENTRY),
    TRL: ("/trl/trainer/", "/trl/models/"),
    INTERNEVO: ("/internlm/",),
    XTUNER: ("/xtuner/",),
    MMENGINE: ("/mmengine/",),
    COLOSSALAI: ("/colossalai/",),
    COMPOSER: ("/composer/",),
    LIGHTNING: ("/pytorch_lightning/", "/lightning/pytorch/", "/lightning/fabric/", "/lightning_fabric/"),
    TRANSFORMERS: ("/transformers/trainer", "/transformers/models/"),
    GPT_NEOX: ("/gpt-neox/", "/gpt_neox/"),
    LIT_LLAMA: ("/lit-llama/", "/lit_llama/"),
    LITGPT: ("/litgpt/", "/lit-gpt/", "/lit_gpt/"),
    LLAMA_RECIPES: ("/llama_recipes/", "/llama_cookbook/", "/llama-recipes/"),
    MMCV: ("/mmcv/runner/",),
    TORCHTUNE: ("/torchtune/",),
    TORCHTITAN: ("/torchtitan/",),
    UNSLOTH: ("/unsloth/", "/unsloth_zoo/", "/unsloth_compiled_cache/"),
    AXOLOTL: ("/axolotl/",),
    FAIRSEQ: ("/fairseq/", "/fairseq_cli/"),
    DEEPSPEED: (
        "/deepspeed/runtime/",
        "/deepspeed/",
    ),
    MEGATRON_LM: (
        "/megatron/training/",
        "/pretrain_gpt.py",
        "/pretrain_mamba.py",
        "/train_rl.py",
        "/megatron/training.py",
    ),
}
# a file of PATHS -> what it is, for the evidence a frame in it gives
FILES = {LLAMA_FACTORY_ENTRY: "LLaMA-Factory's entry script up to v0.7.0, LLaMA-Efficient-Tuning's then"}
# framework -> (a line only its code prints, as a pattern; why it is that framework's). NeMo's logger prefix
# `[NeMo W <time> <module>:<line>]` (the same formatter in 0.x and 1.x) from a module only NeMo 0.x has (NVIDIA/NeMo
# 6a687a1 nemo/backends/pytorch/actions.py, nemo/core/neural_factory.py); DeepSpeed-Chat's epoch line (microsoft/
# DeepSpeedExamples 7cc6cc3 applications/DeepSpeed-Chat/training/step2_reward_model_finetuning/main.py: the epoch's
# mean loss, printed by its reward-model step; forks print it in other steps too)
PATTERNS: dict[str, tuple[re.Pattern, str]] = {
    NEMO_0: (re.compile(r"\[NeMo [DIWEC] [\d-]{10} [\d:]{8} (?:actions|neural_factory):\d{1,6}\]"),
             "NeMo's logger prefix from a module only nemo-0.x has"),
    DEEPSPEED_CHAT: (re.compile(r"^Epoch \d{1,6}/\d{1,6} with loss \S{1,40}$"),
                     "in the format of DeepSpeed-Chat's epoch-mean loss line (its reward-model step, step 2)"),
    MLX_LM: (re.compile(r"^Iter \d{1,9}: (?:Train|Val) loss "), "in the format of mlx-lm's tuner's report line (its ports copy it)"),
}  # fmt: skip
# framework -> texts in a log line that name it (a Ray actor, a logger's prefix)
TEXTS: dict[str, tuple[str, ...]] = {
    SLIME: ("MegatronTrainRayActor", "slime.backends.megatron_utils"),
    VERL: ("ray::WorkerDict.", "verl.single_controller", "(TaskRunner pid=", "(WorkerDict pid="),
    OPENRLHF: ("openrlhf.",),
    NEMO_RL: ("nemo_rl.",),
    ROLL: ("(ActorWorker(actor_train",),
    RLINF: ("rlinf.workers.", "rlinf.scheduler."),  # a Ray actor's repr (`<rlinf.workers.rollout.hf....>`)
    PRIMUS: ("[Primus] ",),  # its CLI's error and notice lines
    MS_SWIFT: ("[INFO:swift]", "[WARNING:swift]"),
    PAI: ("megatron_patch.",),
    NEMO: ("i.pretrain/", "nemo_run", "[NeMo I ", "[NeMo W ", "reduced_train_loss"),
    LLAMA_FACTORY: ("llamafactory.", "llmtuner."),
    INTERNEVO: ("inf_nan_skip_batches", "record_current_batch_training_metrics"),
    XTUNER: ("xtuner.",),
    MMENGINE: (" - mmengine - ",),
    LIGHTNING: ("lightning/fabric/", "lightning_fabric/", "pytorch_lightning/"),  # a warning's path (Fabric's)
    COLOSSALAI: ("colossalai - ", "colossalai.", " / Train]: "),  # its trainer's bar: `[Epoch 0 / Train]: `
    COMPOSER: ("loss/train/total", "composer.trainer"),
    MEGATRON_DEEPSPEED: ("tokens per gpu per second (tgs)", "| actual seqlen:"),
    DEEPSPEED_CHAT: ("|act_loss: ", "|cri_loss: "),
    DPO_REFERENCE: ("train stats after ",),
    GPT_NEOX: ("neox_args",),
    # unsloth rewrites transformers' Trainer._inner_training_loop from its source and execs it as
    # `_fast_inner_training_loop` (unsloth_zoo compiler.py), so its frame is `File "<string>", ..., in` that name
    UNSLOTH: ("in _fast_inner_training_loop", "Unsloth: "),
    # axolotl's logger (src/axolotl/logging_config.py, its `colorful` format: `[%(asctime)s] [%(levelname)s]
    # [%(name)s.%(funcName)s:%(lineno)d] [PID:%(process)d] [RANK:%(rank)d] %(message)s`, loggers named `axolotl.*`)
    AXOLOTL: ("] [axolotl.",),
    # fairseq's loggers from 0.10 (`2021-03-01 10:00:00 | INFO | fairseq.trainer | ...`, fairseq_cli/train.py)
    FAIRSEQ: ("| fairseq.trainer |", "| fairseq_cli.train |", "| fairseq.tasks."),
    # torchtitan's logger (torchtitan/tools/logging.py init_logger: "[titan] %(asctime)s - %(name)s - ...")
    TORCHTITAN: ("[titan] ",),
    # transformers' explicit log format (utils/logging.py:301 at 5.10.4, `[INFO|trainer.py:2128] ... >> `), its
    # Trainer's banner (trainer.py:1475) and metrics blocks (trainer_pt_utils.py:912)
    TRANSFORMERS: (
        "|trainer.py:",
        "***** Running training *****",
        "***** train metrics *****",
        "***** eval metrics *****",
    ),
    # train_utils.py's bar (`Training Epoch: 4/150, step 63/64 completed (loss: ...)`) and memory trace lines
    LLAMA_RECIPES: (
        " completed (loss: ",
        "Max CUDA memory allocated was",
        "CPU Total Peak Memory consumed during the train",
    ),
    # the mmcv runner's logger is the OpenMMLab project's own (mmengine's is ` - mmengine - `)
    MMCV: (
        " - mmocr - ",
        " - mmdet - ",
        " - mmseg - ",
        " - mmcls - ",
        " - mmpose - ",
        " - mmdet3d - ",
        " - mmaction - ",
        " - mmedit - ",
    ),
    # its logger's `[file.py:line:function]` of the loss scaler and the optimizers that print an overflow
    DEEPSPEED: (
        "[deepspeed]",
        "deepspeed.runtime",
        "loss_scaler.py:",
        "DeepSpeed ",
        "] [stage2.py:",
        "] [stage3.py:",
        "] [stage_1_and_2.py:",
        "] [fused_optimizer.py:",
        "] [unfused_optimizer.py:",
    ),
}
# A marker among the metric keys: the lines hold a Python dict (`{'loss': nan, ...}`), as transformers' Trainer prints
# its logs. `loss`, `learning_rate`, `epoch` alone are any loop's (rl-coach prints `Surrogate loss=nan, ...,
# training epoch=0, learning_rate=0.0003`: IntelLabs/coach rl_coach/logger.py:103-115, clipped_ppo_agent.py:294-303)
PY_DICT = "{'...'}"
# framework -> metric keys (as printed, lowered) that only its logs hold, each set all present
KEYS: dict[str, tuple[frozenset[str], ...]] = {
    MS_SWIFT: (frozenset({"global_step/max_steps"}), frozenset({"memory(gib)", "train_speed(iter/s)"})),
    TRL: (frozenset({"rewards/chosen", "logps/chosen"}), frozenset({"reward_std", "kl", "completion_length"}),
          frozenset({"reward_std", "kl", "completions/mean_length"}), frozenset({"logits/chosen", "rewards/margins"}),
          # GRPO's share of groups with one reward (v0.21.0 trl/trainer/grpo_trainer.py:1732), logged with beta 0 (no kl)
          frozenset({"reward_std", "frac_reward_zero_std"})),
    DPO_REFERENCE: (frozenset({"rewards_train/chosen"}),),
    VERL: (frozenset({"actor/pg_loss"}), frozenset({"critic/vf_loss"}), frozenset({"actor/grad_norm"}),
           frozenset({"train/loss", "train/global_tokens"})),
    MEGATRON_LM: (frozenset({"consumed samples", "elapsed time per iteration (ms)"}),
                  frozenset({"learning rate", "global batch size", "loss scale"}),
                  frozenset({"elapsed time per iteration (ms)", "lm loss", "loss scale"})),
    NANOGPT: (frozenset({"iter", "loss", "time", "mfu"}),),
    TRANSFORMERS: (frozenset({PY_DICT, "loss", "learning_rate", "epoch"}),
                   frozenset({PY_DICT, "grad_norm", "learning_rate", "epoch"}),
                   frozenset({"step", "training loss"}),  # its notebook callback's table
                   frozenset({PY_DICT, "eval_runtime", "eval_samples_per_second"})),  # an evaluation's dict
    LIGHTNING: (frozenset({"v_num"}),),
    # DeepSpeed's PipelineEngine.train_batch, on global rank 0: print(f'steps: {self.global_steps} loss:
    # {self.agg_train_loss:0.4f} iter time (s): {iter_time:0.3f} samples/sec: {tput:0.3f}') (deepspeed
    # runtime/pipe/engine.py; tdrussell/diffusion-pipe#531, holdout10 02)
    DEEPSPEED: (frozenset({"steps", "loss", "samples/sec"}),),
    # slime's train step log: `step N: {'train/loss': ..., 'train/lr-pg_0': ...}` (v0.1.0 slime/backends/
    # megatron_utils/model.py:459, :464 `train/lr-pg_{id}`); from v0.2.4 its loss logs train_rollout_logprob_abs_diff
    SLIME: (frozenset({"train/lr-pg_0"}), frozenset({"train/pg_loss", "train/train_rollout_logprob_abs_diff"})),
    # OpenRLHF's PPO progress bar up to v0.6 (openrlhf/trainer/ppo_trainer.py:300-311 at v0.6.0: pg, rm, ret, glen, tlen)
    OPENRLHF: (frozenset({"pg", "glen", "tlen"}),),
    # NeMo-Aligner's SFT bar (`Training steps: ... train_grad_norm=nan, train_lr=0, train_loss=1.57,
    # train_consumed_samples=8`: NeMo-Aligner af2b3bd nemo_aligner/algorithms/supervised.py:226, :244, :265), on NeMo
    NEMO: (frozenset({"train_grad_norm", "train_consumed_samples"}), frozenset({"train_loss", "train_consumed_samples"})),
    # NeMo-RL's policy loss metrics (nemo_rl/algorithms/loss_functions.py, ClippedPGLossFn: token_mult_prob_error)
    NEMO_RL: (frozenset({"token_mult_prob_error"}),),
    # gpt-neox's training_log spells the loss `lm_loss` (Megatron-LM: `lm loss`): ea7aefd8 megatron/training.py:1394,
    # megatron/logging.py:472 (elapsed time per iteration), :495 (approx flops per GPU)
    GPT_NEOX: (frozenset({"lm_loss", "elapsed time per iteration (ms)"}),),
    # fairseq's progress and epoch lines (fairseq/logging/progress_bar.py, trainer.py's stats: wps, ups, wpb, bsz,
    # num_updates, lr, gnorm, clip, oom, loss_scale, wall, train_wall), `| key value |` or `key=value, `; its forks
    # print them too (metaseq, which trained OPT): their logs are named fairseq's
    FAIRSEQ: (frozenset({"num_updates", "wpb", "bsz"}),),
}  # fmt: skip
# What a launch trains, by its entry point (the module, CLI or script, as launch.script reads it): the kinds are "rl"
# (rollouts, rewards, a policy loss: PPO, GRPO), "preference" (DPO, KTO, ORPO, ...: a policy and a reference, no
# rollout), "reward-model", "sft" and "pretraining". Only "rl" has rollouts, rollout log-probs and a reward function.
RUN_KINDS = (
    ("-m verl.trainer.fsdp_sft_trainer", "sft"), ("-m verl.trainer.sft_trainer", "sft"),
    ("-m verl.trainer.main_ppo", "rl"), ("-m verl.trainer.main_generation", None),
    ("-m openrlhf.cli.train_ppo", "rl"), ("-m openrlhf.cli.train_sft", "sft"), ("-m openrlhf.cli.train_dpo", "preference"),
    ("-m openrlhf.cli.train_kto", "preference"), ("-m openrlhf.cli.train_rm", "reward-model"),
    ("megatron sft", "sft"), ("megatron pt", "pretraining"), ("megatron rlhf_grpo", "rl"), ("swift sft", "sft"),
    ("swift pt", "pretraining"), ("nemo llm pretrain", "pretraining"), ("nemo llm finetune", "sft"),
    ("pretrain_gpt.py", "pretraining"), ("pretrain_mamba.py", "pretraining"), ("pretrain_bert.py", "pretraining"),
    ("pretrain_t5.py", "pretraining"), ("grpo.py", "rl"),
)  # fmt: skip
# The flag that names the kind where the entry point does not: ms-swift's `--rlhf_type` (swift/llm/argument/
# rlhf_args.py: dpo, orpo, simpo, kto, cpo, rm, ppo, grpo, gkd), LLaMA-Factory's `--stage` (pt, sft, rm, ppo, dpo,
# kto); a value not listed (gkd) names no kind.
KIND_FLAGS = {
    "--rlhf-type": {"dpo": "preference", "orpo": "preference", "simpo": "preference", "kto": "preference",
                    "cpo": "preference", "rm": "reward-model", "ppo": "rl", "grpo": "rl"},
    "--stage": {"pt": "pretraining", "sft": "sft", "rm": "reward-model", "ppo": "rl", "dpo": "preference",
                "kto": "preference"},
}  # fmt: skip
# DeepSpeed-Chat's step 2 and 3 main.py `--num_padding_at_beginning` (OPT's padding; step 1's SFT has none), as
# launch.flagview spells every flag (`_` as `-`)
PADDING_FLAG = "--num-padding-at-beginning"
# A flag only one framework's parser defines (`_` as `-`): LLaMA-Factory's FinetuningArguments.finetuning_type,
# DeepSpeed-Chat's padding flag
OWN_FLAGS = (("--finetuning-type", LLAMA_FACTORY), (PADDING_FLAG, DEEPSPEED_CHAT))
# The flags that, all given, name the kind where neither the entry point nor a kind flag does, first match first:
# DeepSpeed-Chat's main.py is each step's (DeepSpeedExamples applications/DeepSpeed-Chat/training/): step 3's RLHF
# takes `--actor_model_name_or_path` and `--critic_model_name_or_path`, step 2's reward model `--model_name_or_path`,
# both `--num_padding_at_beginning` (OPT's padding), which step 1's SFT does not define
KIND_FLAG_SETS = (
    ((PADDING_FLAG, "--actor-model-name-or-path"), "rl"),
    ((PADDING_FLAG, "--model-name-or-path"), "reward-model"),
)
# What a frame is, by its path, most specific first: what a traceback cut before its error line reaches.
COMPONENTS = (
    ("/deepspeed/runtime/zero/stage_1_and_2.py", "DeepSpeed's ZeRO stage 1 and 2 optimizer"),
    ("/deepspeed/runtime/zero/stage3.py", "DeepSpeed's ZeRO stage 3 optimizer"),
    ("/deepspeed/runtime/zero/stage2.py", "DeepSpeed's ZeRO stage 2 optimizer"),
    ("/deepspeed/runtime/fp16/loss_scaler.py", "DeepSpeed's fp16 loss scaler"),
    ("/deepspeed/runtime/fp16/fused_optimizer.py", "DeepSpeed's FP16_Optimizer"),
    ("/deepspeed/runtime/fp16/unfused_optimizer.py", "DeepSpeed's FP16_UnfusedOptimizer"),
    ("/deepspeed/runtime/bf16_optimizer.py", "DeepSpeed's BF16 optimizer"),
    ("/torch/nn/utils/clip_grad.py", "torch's gradient clipping"),
    ("/torch/autograd/", "autograd's backward pass"),
    ("/torch/optim/", "a torch optimizer's step"),
    ("/torch/amp/grad_scaler.py", "torch's GradScaler"),
    ("/torch/cuda/amp/grad_scaler.py", "torch's GradScaler"),
    ("/transformers/generation/", "transformers' generation (sampling)"),
    ("/deepspeed/runtime/engine.py", "DeepSpeed's engine"),
)  # fmt: skip
# The megatron-core package, which every one of them calls (not a framework of its own).
CORE = "/megatron/core/"

# framework -> (a launch script's file name that only its examples use, where) : a site wrapper that runs it
# (`sh run_mcore_llama3_1.sh dsw 8B 1 4 ...`, alibaba/Pai-Megatron-Patch#437, holdout21 01) names the framework
WRAPPED_SCRIPTS: dict[str, tuple[str, str]] = {
    PAI: (
        r"run_mcore_[a-z0-9_.]+\.sh",
        "Pai-Megatron-Patch's examples/<model>/run_mcore_<model>.sh launch scripts "
        "(examples/llama3_1/run_mcore_llama3_1.sh at 33191bd)",
    ),
}
