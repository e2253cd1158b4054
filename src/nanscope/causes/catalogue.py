"""The hazard catalogue as data: each cause of a non-finite step that nanscope builds, plants or runs.

A hazard changes one thing of a case-shaped GRPO batch, at one token or sample, or one loss flag, the way it
happens in a real run (level "batch"), or names a fault to plant in the harness model (level "model"). Each
record carries its mechanism, the flags that enable it, what slime v0.1.0's loss gives on it, its class of
cause (`causes.classes`), where the fix lives and the cheapest observation that tells it apart. The batches
are built by `nanscope.hazards`; the causes slime is immune to are `causes.immune`.

    python -c "from nanscope.causes import catalogue; print([h.name for h in catalogue.CATALOGUE])"
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.causes.classes import DATA, HARDWARE, LOSS_NUMERICS, MODEL_BACKWARD, MODEL_FORWARD
from nanscope.errors import UserError
from nanscope.facts.paths import LOSS_FUNCTION_PATH


@dataclass(frozen=True)
class Hazard:
    """One catalogue entry. `loss_finite` / `grad_finite` are what slime v0.1.0 produces on it.

    Attributes:
        name: the hazard's one spelling (CLI, JSON, scan's mechanisms, doctor's findings).
        mechanism: the chain of ops from the trigger to the non-finite value, in words.
        flags: the flags that enable it (for the first five, the case's own).
        loss_finite, grad_finite: slime v0.1.0's loss on the hazard's batch (level "model": the harness
            run with the fault planted).
        masked_token: the trigger sits on a masked (loss_mask 0) token, so the fix must leave the step
            exactly as it is on the hazard's defused twin.
        cause_class: the class of cause (causes.classes.CLASSES); None for the healthy batch.
        level: "batch" (a change to the micro-batch or a loss flag) or "model" (a fault planted in the
            harness model, named by `fault`: MODULE:forward|backward:nan|inf).
        fix: where the fix lives.
        discriminator: the single cheapest observation that confirms or excludes it.
        loss_overrides: slime loss fields (facts.args.LOSS_FIELDS) the hazard sets, e.g. a flag value.
        fault: level "model": the fault spec planted in the harness model.
        safe_finite: nanscope's safe loss gives a finite loss and gradient on it (False where the fix
            lives elsewhere: a flag, the model).
        fault_once: level "model": the fault fires on its module's first call only (a transient fault).
        drifts: the trigger grows a little every step and crosses at the hazard's step (repro --steps N
            --inject-step K: the steps before K carry a fraction k / K of it).
    """

    name: str
    mechanism: str
    flags: tuple[str, ...]
    loss_finite: bool
    grad_finite: bool
    masked_token: bool = False
    cause_class: str | None = None
    level: str = "batch"
    fix: str = ""
    discriminator: str = ""
    loss_overrides: dict = field(default_factory=dict, hash=False)
    fault: str | None = None
    safe_finite: bool = True
    fault_once: bool = False
    drifts: bool = False


PLUGIN_FIX = f"the loss: {LOSS_FUNCTION_PATH} (--loss-type custom_loss)"
TRACE_CLASS = "the sentinel's class from one rerun step (repro --json `sentinel`, the plugin's report `class`)"

HEALTHY = Hazard(
    "healthy",
    "A case-shaped GRPO batch with nothing extreme in it: every term stays finite.",
    (),
    loss_finite=True,
    grad_finite=True,
)
KL_EXP_OVERFLOW = Hazard(
    "kl-exp-overflow",
    "At a masked tool-output token the reference model's log-prob exceeds the policy's by more than "
    "88.72 nats; low_var_kl computes exp(ref - logp) = inf BEFORE its [-10, 10] clamp, so the loss "
    "stays finite but the backward pass multiplies the clamp's zero gradient by exp's inf: NaN, "
    "even at --kl-loss-coef 0 and on a token the loss mask removes.",
    ("--use-kl-loss", "--kl-loss-type low_var_kl", "--kl-loss-coef 0.00"),
    loss_finite=True,
    grad_finite=False,
    masked_token=True,
    cause_class=LOSS_NUMERICS,
    fix=f"{PLUGIN_FIX} (clamps the log-ratio before exp); or drop --use-kl-loss while --kl-loss-coef is 0",
    discriminator=f"{TRACE_CLASS}: loss-numerics, and `nanscope trace` names ExpBackward0 created in approx_kl",
)
RATIO_EXP_OVERFLOW = Hazard(
    "ratio-exp-overflow",
    "At a masked token the training forward's log-prob exceeds the log-prob pass's (old_log_probs) by more "
    "than 88.72 nats; the PPO ratio exp(logp - old) overflows to inf BEFORE the eps-clip, the clipped "
    "branch wins for a positive advantage so the loss stays finite, and the backward pass computes 0 * inf = NaN. "
    "It needs the two passes to disagree (stale or reloaded weights, more than one step per rollout).",
    ("--eps-clip 0.2", "--eps-clip-high 0.28"),
    loss_finite=True,
    grad_finite=False,
    masked_token=True,
    cause_class=LOSS_NUMERICS,
    fix=f"{PLUGIN_FIX} (clamps the log-ratio before exp)",
    discriminator=f"{TRACE_CLASS}: loss-numerics, and `nanscope trace` names ExpBackward0 created in "
    "ppo_clip_loss; a ppo_kl metric far from 0 on earlier steps",
)
NAN_ROLLOUT_LOGPROB = Hazard(
    "nan-rollout-logprob",
    "The custom generate function hands back a NaN rollout log-prob for one tool-output token; TIS computes "
    "clamp(exp(old - NaN)) = NaN (clamp passes NaN), multiplies the token's loss by it, and the mask "
    "multiplication keeps NaN * 0 = NaN: NaN loss and gradient.",
    ("--use-tis", "--custom-generate-function-path"),
    loss_finite=False,
    grad_finite=False,
    masked_token=True,
    cause_class=DATA,
    fix="the generate function (return one finite log-prob per response token, tool tokens included); "
    f"as a backstop {PLUGIN_FIX} drops the token",
    discriminator="`nanscope scan` of the rollout dump (--save-debug-rollout-data): a nonfinite-rollout-logprob "
    "row names the sample and token",
)
NAN_REWARD = Hazard(
    "nan-reward",
    "The custom reward function returns NaN for one sample; GRPO group normalisation (mean, std) spreads it "
    "to all 8 samples of the prompt, every advantage of the group is NaN: NaN loss and gradient.",
    ("--custom-rm-path", "--advantage-estimator grpo", "--n-samples-per-prompt 8"),
    loss_finite=False,
    grad_finite=False,
    cause_class=DATA,
    fix=f"the reward function (return finite floats); as a backstop {PLUGIN_FIX} drops the group",
    discriminator="`nanscope scan` of the rollout dump: a nonfinite-reward row names the sample (the rollout's "
    "logged raw reward is NaN too)",
)

ZERO_TEMPERATURE = Hazard(
    "zero-temperature",
    "--rollout-temperature 0 (greedy rollouts): slime v0.1.0 divides the logits by it in the log-prob pass and in "
    "the loss (backends/megatron_utils/loss.py:54) and never checks it is positive. Every logit becomes +-inf, "
    "the log-softmax computes inf - inf = NaN: log_probs and ref_log_probs are NaN for every token, and so are the "
    "training loss and its gradient. (SGLang treats temperature 0 as greedy, so rollout_log_probs stay finite.)",
    ("--rollout-temperature 0",),
    loss_finite=False,
    grad_finite=False,
    cause_class=DATA,
    fix="the launch flags: a positive --rollout-temperature (slime v0.1.0's arguments.py accepts 0)",
    discriminator="the flag itself: `nanscope doctor` reads --rollout-temperature from the launch script",
    loss_overrides={"rollout_temperature": 0.0},
    safe_finite=False,
)
ROLLOUT_LOGPROB_SHIFT = Hazard(
    "rollout-logprob-shift",
    "The generate function (or a weight-sync / conversion bug) returns rollout log-probs misaligned by one token: "
    "token j gets token j+1's log-prob. They are finite, so TIS's exp(old - rollout) is huge but only data: "
    "slime clamps it to [tis_clip_low, tis_clip] after the exp and no gradient flows through it. Loss and "
    "gradient stay finite; the tis metric explodes (inf or NaN when a log-ratio passes 88.72) and tis_clipfrac "
    "jumps. Its NaN variant, a run of token id 0 with NaN log-probs, is nan-rollout-logprob.",
    ("--use-tis", "--custom-generate-function-path"),
    loss_finite=True,
    grad_finite=True,
    cause_class=DATA,
    fix="the generate function or the weight sync (one rollout log-prob per response token, in order)",
    discriminator="the tis and tis_clipfrac metrics: a mean TIS weight far above --tis-clip, a large clip "
    "fraction; `nanscope scan` counts tis-margin tokens",
)
ACTIVATION_OVERFLOW = Hazard(
    "activation-overflow",
    "One layer's output becomes inf in the forward pass: bf16/fp16 past the format's max, or a kernel that reads "
    "uninitialised memory (MoE experts that receive zero tokens are a recurring example). The next RMSNorm "
    "computes inf / inf = NaN, the logits and the loss are NaN, and so is every gradient. Planted in the harness "
    "as an inf in the MoE layer's output.",
    (),
    loss_finite=False,
    grad_finite=False,
    cause_class=MODEL_FORWARD,
    level="model",
    fix="the model: the layer the sentinel names (its precision, initialisation or kernel)",
    discriminator=f"{TRACE_CLASS}: model-forward, naming the layer",
    fault="decoder.layers.1.mlp:forward:inf",
    safe_finite=False,
)
BACKWARD_ONLY_FAULT = Hazard(
    "backward-only-fault",
    "A module whose backward produces NaN from finite inputs, standing in for a kernel bug: the forward, the "
    "loss and the gradient the loss sends back are all finite, and the module's parameter gradients are NaN.",
    (),
    loss_finite=True,
    grad_finite=False,
    cause_class=MODEL_BACKWARD,
    level="model",
    fix="the model: the kernel behind the module the sentinel names",
    discriminator=f"{TRACE_CLASS}: model-backward, naming the module",
    fault="decoder.layers.0.self_attention:backward:nan",
    safe_finite=False,
)

LOGPROB_DRIFT = Hazard(
    "logprob-drift",
    "The policy drifts away from the reference model, a little every step, on the tool-output tokens it never trains "
    "on (loss_mask 0): the KL log-ratio ref - logp at the least likely tool token grows step by step until it passes "
    "88.72 and low_var_kl's exp overflows BEFORE its clamp, as in kl-exp-overflow. Every step before that one is "
    "finite; the headroom metrics show it coming (nanscope/max_kl_log_ratio past 20, then past 60).",
    ("--use-kl-loss", "--kl-loss-type low_var_kl", "--kl-loss-coef 0.00"),
    loss_finite=True,
    grad_finite=False,
    masked_token=True,
    cause_class=LOSS_NUMERICS,
    fix=f"{PLUGIN_FIX} (clamps the log-ratio before exp); or drop --use-kl-loss while --kl-loss-coef is 0",
    discriminator="the headroom metrics' trend: nanscope/max_kl_log_ratio rising step by step (the plugin's warning "
    "past 20 and 60; `nanscope scan DIR/`'s trend chart)",
    drifts=True,
)
TRANSIENT_FAULT = Hazard(
    "transient-fault",
    "A device computes one wrong value once (a flipped bit, a faulty link or motherboard, an XID error): one module's "
    "output holds an inf on the step's first micro-batch only. Megatron's check fails the step exactly as for a "
    "persistent fault; run again on the same data the step is finite. Planted in the harness as a one-time inf in "
    "an MoE layer's output (repro --fault MODULE:forward:inf --fault-once).",
    (),
    loss_finite=False,
    grad_finite=False,
    cause_class=HARDWARE,
    level="model",
    fix="the device: dmesg XID and ECC errors, a burn-in of that device, TORCH_NCCL_NAN_CHECK=1 on the next run",
    discriminator="the plugin's rerun verdict (NANSCOPE_RERUN=on): not reproducible, naming the rank, node and device "
    "of the first producer",
    fault="decoder.layers.1.mlp:forward:inf",
    safe_finite=False,
    fault_once=True,
)

# The MoE causes: megatron-core 0.15.0rc0's router and experts (doctor's evidence is in nanscope.launch.moe).
_ROUTER = "megatron/core/transformer/moe/router.py"
_MOE_UTILS = "megatron/core/transformer/moe/moe_utils.py"
MOE_AUX_LOSS = Hazard(
    "moe-aux-loss",
    "The router's load-balancing losses (--moe-router-load-balancing-type aux_loss / seq_aux_loss with a non-zero "
    f"--moe-aux-loss-coeff) and its z-loss (--moe-z-loss-coeff) ride on the router's outputs through "
    f"MoEAuxLossAutoScaler ({_MOE_UTILS}:165-201): the forward is unchanged, and in backward the loss adds its "
    "gradient inside the router's own backward. At coefficient 0 neither load-balancing loss is computed "
    f"({_ROUTER}:229-231, :268-270). Their gradient is finite wherever the router's logits are: the scaler sends "
    f"ones x the loss scale whatever the loss's value ({_MOE_UTILS}:201), d aux / d scores is tokens_per_expert x a "
    f"constant ({_MOE_UTILS}:107-110), d z-loss / d logits is 2 logsumexp x softmax x coeff / tokens "
    f"({_MOE_UTILS}:125); an overflowing z-loss value (|logsumexp| past 1.8e19, or 256 in fp16) is only logged. "
    "The one NaN of their own: sigmoid scores in fp16 logits, normalised by sum + 1e-20 "
    f"({_MOE_UTILS}:621-622), where 1e-20 is 0: 0 / 0 once every expert's sigmoid underflows. Planted in the harness "
    "as a NaN in the gradient at a router's output, made in the router's backward.",
    ("--moe-aux-loss-coeff", "--moe-router-load-balancing-type aux_loss|seq_aux_loss", "--moe-z-loss-coeff"),
    loss_finite=True,
    grad_finite=False,
    cause_class=MODEL_BACKWARD,
    level="model",
    fix="the flags: --moe-aux-loss-coeff 0 and no --moe-z-loss-coeff (--moe-router-load-balancing-type none does "
    "what coefficient 0 does), or --moe-router-dtype fp32 for sigmoid scores; the loss cannot fix it",
    discriminator="the model-args flags (--moe-aux-loss-coeff, --moe-router-load-balancing-type, --moe-z-loss-coeff), "
    "then the sentinel: model-backward naming decoder.layers.L.mlp.router while every module output was finite in "
    "forward; the step's logged load_balancing_loss / z_loss",
    fault="decoder.layers.2.mlp.router:backward:nan",
    safe_finite=False,
)
MOE_ZERO_TOKEN_EXPERT = Hazard(
    "moe-zero-token-expert",
    "An expert that receives no token in a micro-batch under a grouped GEMM whose weight-gradient buffer is "
    "uninitialised memory: the kernel skips the empty group and never writes that expert's rows, which hold whatever "
    "the allocator recycled (NaN once memory is reused: often from the second step on). Megatron's DDP adds them to "
    "the expert's main_grad and the expert bucket's norm is NaN. It holds for torch._grouped_mm (pytorch#172439, "
    "#193633), MSLK's grouped GEMM (MSLK#97) and the legacy grouped_gemm's torch.empty wgrad (--moe-use-legacy-grouped-"
    "gemm: grouped_gemm v1.1.4 backend.py:22, tgale96/grouped_gemm#36); not for TransformerEngine 2.6's GroupedLinear "
    "(megatron's TEGroupedMLP), whose grouped GEMM zeroes an empty group's weight gradient unless it accumulates into "
    "Megatron's zeroed main_grad (transformer_engine/pytorch/csrc/extensions/gemm.cpp:390-391 at v2.6). With 128 "
    "experts, top-8 and micro-batches cut by --max-tokens-per-gpu, an expert with 0 tokens is ordinary. Planted in the "
    "harness (its experts are SequentialMLP, not a grouped GEMM): the expert's router logit is pushed out of every "
    "top-k, and its weight gradient is a fresh allocation filled with NaN, where a grouped GEMM's unwritten rows "
    "would be.",
    ("--moe-grouped-gemm", "--moe-use-legacy-grouped-gemm or a grouped GEMM other than TransformerEngine 2.6's"),
    loss_finite=True,
    grad_finite=False,
    cause_class=MODEL_BACKWARD,
    level="model",
    fix="the kernel or the allocation, not the loss: TransformerEngine's grouped GEMM (drop "
    "--moe-use-legacy-grouped-gemm), a zero-initialised weight-gradient buffer, or no --moe-grouped-gemm "
    "(SequentialMLP gives an empty expert exact zeros)",
    discriminator="the sentinel's report: expert e of layer l received 0 tokens, and its weight gradient is the first "
    "non-finite one (`expert_tokens` for the failing micro-batch)",
    fault="decoder.layers.3.mlp.experts.local_experts.5:zero-tokens:nan",
    safe_finite=False,
)
MOE_ROUTER_LOGITS = Hazard(
    "moe-router-logits",
    "The router's logits come out of its GEMM in the input's dtype unless --moe-router-dtype is fp32 or fp64 "
    f"({_ROUTER}:78-83, {_MOE_UTILS}:931-935). In fp16 (slime from v0.2.4, without expert parallelism) a logit past "
    "65504 is inf and the softmax's inf - inf is NaN; bf16 logits have fp32's exponent range, so they overflow only "
    f"where fp32 would (top-k's softmax runs in fp32: {_MOE_UTILS}:571, 575). Sinkhorn load balancing "
    f"(--moe-router-load-balancing-type sinkhorn) takes exp of the fp32 logits with no max subtracted "
    f"({_MOE_UTILS}:131): a logit past 88.72 is inf, then inf / inf. A NaN prob reaches the expert outputs and every "
    "later layer. Planted in the harness as a NaN in one routed prob of a router's output.",
    ("--fp16 without --moe-router-dtype fp32", "--moe-router-load-balancing-type sinkhorn"),
    loss_finite=False,
    grad_finite=False,
    cause_class=MODEL_FORWARD,
    level="model",
    fix="the flags: --moe-router-dtype fp32 (and a load-balancing type other than sinkhorn)",
    discriminator="the sentinel: model-forward, the first non-finite output decoder.layers.L.mlp.router in forward "
    "order (its probs), every module before it finite",
    fault="decoder.layers.1.mlp.router:forward:nan",
    safe_finite=False,
)

CATALOGUE: tuple[Hazard, ...] = (
    HEALTHY, KL_EXP_OVERFLOW, RATIO_EXP_OVERFLOW, NAN_ROLLOUT_LOGPROB, NAN_REWARD,
    ZERO_TEMPERATURE, ROLLOUT_LOGPROB_SHIFT, ACTIVATION_OVERFLOW, BACKWARD_ONLY_FAULT, TRANSIENT_FAULT,
    LOGPROB_DRIFT, MOE_AUX_LOSS, MOE_ZERO_TOKEN_EXPERT, MOE_ROUTER_LOGITS,
)  # fmt: skip
BY_NAME = {h.name: h for h in CATALOGUE}
# `nanscope repro`'s default matrix: the healthy batch and the case's own four hazards (`--all`: the catalogue)
CASE_HAZARDS: tuple[Hazard, ...] = (HEALTHY, KL_EXP_OVERFLOW, RATIO_EXP_OVERFLOW, NAN_ROLLOUT_LOGPROB, NAN_REWARD)


def get(name: str) -> Hazard:
    """Look a hazard up by name; an unknown name is a UserError (a ValueError) listing the known ones."""
    if name not in BY_NAME:
        raise UserError(f"unknown hazard {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]
