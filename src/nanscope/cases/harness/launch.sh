#!/bin/bash

# The world `nanscope repro` runs, as a slime launch script: the harness's tiny Qwen3-MoE (4 layers, hidden 64,
# 8 experts top-2) at TP2 PP2 with sequence parallelism on 1 node x 4 GPUs (CPU ranks, gloo), one rollout group of
# 8 a step, with the case's loss flags (slime-795's GRPO_ARGS), on slime@v0.1.0's loss and train_one_step.
# It is what `nanscope doctor` reads a repro's traceback against:
#
#   nanscope repro --launcher ray --hazard kl-exp-overflow --traceback-out tb.txt
#   nanscope doctor --case harness --traceback tb.txt
#
# Read, never executed. Each value is the harness's own (megatron/model.py's TinyQwen3MoE and Adam, the case's
# loss flags); tests/test_case.py checks them against the code.

MODEL_ARGS=(
   --disable-bias-linear
   --qk-layernorm
   --group-query-attention
   --num-attention-heads 8
   --num-query-groups 4
   --kv-channels 16
   --num-layers 4
   --hidden-size 64
   --ffn-hidden-size 128

   --normalization RMSNorm
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 512
   --max-position-embeddings 512
   --rotary-base 1000000

   # moe: every layer
   --moe-ffn-hidden-size 32
   --moe-router-score-function softmax
   --moe-token-dispatcher-type allgather
   --moe-router-topk 2
   --num-experts 8
   --moe-router-dtype fp32
   --moe-router-load-balancing-type none
)

ROLLOUT_ARGS=(
   --rollout-batch-size 1
   --n-samples-per-prompt 8
   --rollout-temperature 0.8

   --global-batch-size 8
   --micro-batch-size 1
)

PERF_ARGS=(
   --tensor-model-parallel-size 2
   --sequence-parallel
   --pipeline-model-parallel-size 2
   --context-parallel-size 1
   --expert-model-parallel-size 1
   # the loss also runs slime's context-parallel split (CP 2, the case's) inside each rank: no ranks, no flag
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --use-kl-loss
   --kl-loss-coef 0.00
   --kl-loss-type low_var_kl
   --entropy-coef 0.00
   --eps-clip 0.2
   --eps-clip-high 0.28
   --use-tis
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
)

MISC_ARGS=(
   --bf16
   --transformer-impl local   # megatron-core's local spec: no TransformerEngine on CPU
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
)

python3 train.py \
   --actor-num-nodes 1 \
   --actor-num-gpus-per-node 4 \
   --colocate \
   ${MODEL_ARGS[@]} \
   ${ROLLOUT_ARGS[@]} \
   ${PERF_ARGS[@]} \
   ${GRPO_ARGS[@]} \
   ${OPTIMIZER_ARGS[@]} \
   ${MISC_ARGS[@]}
