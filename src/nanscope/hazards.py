"""The hazard catalogue: rollout batches shaped like case slime-795 that make slime v0.1.0's loss non-finite.

Each batch is built the way slime's passes would have produced it, from a policy (any function
from token sequences to full-vocabulary logits: the synthetic one below, or the tiny megatron
model of the harness):

    rollout      8 samples of one prompt (n-samples-per-prompt 8), multi-turn: model tokens
                 (loss_mask 1) around a tool-output span (loss_mask 0)
    log_probs    the policy's own log-probs of the tokens at temperature 0.8 (the log-prob pass;
                 one optimizer step per rollout in the case, so old == current policy)
    ref_log_probs  the reference model's: the policy's plus small noise (it has not drifted far)
    rollout_log_probs  SGLang's: the policy's plus small noise on model tokens; 0.0 on tool-output
                 tokens, as multi-turn generate functions fill them; bfloat16, as slime stores them
    advantages   GRPO: raw rewards normalised per group (mean, std + 1e-6), broadcast per token

A hazard then changes one thing, at one token or sample, or one loss flag, the way it happens in a real
run (level "batch"), or names a fault to plant in the harness model (level "model"). Each record also
carries its class of cause (nanscope.trace.classify), where the fix lives and the cheapest observation
that tells it apart. `IMMUNE` lists causes real runs hit that slime v0.1.0's own code rules out, with
the file:line that shows it.

    python -c "from nanscope import hazards; print([h.name for h in hazards.CATALOGUE])"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from nanscope import case
from nanscope.errors import UserError
from nanscope.launch.tracebacks import MCORE, SLIME
from nanscope.trace.classify import DATA, LOSS_NUMERICS, MODEL_BACKWARD, MODEL_FORWARD, OPTIMIZER

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

# torch is imported by the functions that build batches: the catalogue itself (what `nanscope repro` reads
# before it launches the harness) needs none.
# A policy maps per-sample token sequences [total_i] to full-vocabulary logits [total_i, V] (T = 1).
Policy: TypeAlias = "Callable[[list[torch.Tensor]], list[torch.Tensor]]"


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
        cause_class: the class of cause (nanscope.trace.classify.CLASSES); None for the healthy batch.
        level: "batch" (a change to the micro-batch or a loss flag) or "model" (a fault planted in the
            harness model, named by `fault`: MODULE:forward|backward:nan|inf).
        fix: where the fix lives.
        discriminator: the single cheapest observation that confirms or excludes it.
        loss_overrides: slime loss fields (slime_args.LOSS_FIELDS) the hazard sets, e.g. a flag value.
        fault: level "model": the fault spec planted in the harness model.
        safe_finite: nanscope's safe loss gives a finite loss and gradient on it (False where the fix
            lives elsewhere: a flag, the model).
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


@dataclass(frozen=True)
class Immune:
    """A cause that real RL runs hit but slime v0.1.0 cannot: the catalogue says so instead of inventing a hazard.

    Attributes:
        name: kebab-case id (doctor's candidates use it).
        cause: what would go wrong, in words.
        why: why slime v0.1.0 is immune.
        evidence: "file:line (release)" that shows it, at slime v0.1.0 or megatron-core 0.15.0rc0.
        cause_class: the class it would have (nanscope.trace.classify.CLASSES).
    """

    name: str
    cause: str
    why: str
    evidence: tuple[str, ...]
    cause_class: str


PLUGIN_FIX = "the loss: nanscope.slime_plugin.policy_loss (--loss-type custom_loss)"
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

CATALOGUE: tuple[Hazard, ...] = (
    HEALTHY, KL_EXP_OVERFLOW, RATIO_EXP_OVERFLOW, NAN_ROLLOUT_LOGPROB, NAN_REWARD,
    ZERO_TEMPERATURE, ROLLOUT_LOGPROB_SHIFT, ACTIVATION_OVERFLOW, BACKWARD_ONLY_FAULT,
)  # fmt: skip
BY_NAME = {h.name: h for h in CATALOGUE}

IMMUNE: tuple[Immune, ...] = (
    Immune(
        "singleton-group",
        "a GRPO group of one sample (--n-samples-per-prompt 1): the unbiased std of one value is NaN",
        "slime turns GRPO std normalisation off when n-samples-per-prompt is 1, and reshapes the rewards into "
        "groups of exactly n-samples-per-prompt, so a group of one never meets std() (the same rule holds in "
        "v0.2.4 and v0.3.1)",
        (f"slime/utils/arguments.py:996 ({SLIME})", f"slime/ray/buffer.py:93 ({SLIME})"),
        DATA,
    ),
    Immune(
        "zero-std-group",
        "a group whose rewards are all equal: std 0 divides the centred rewards",
        "slime divides by std + 1e-6, and the centred rewards are exactly 0: advantages 0, finite",
        (f"slime/ray/buffer.py:99 ({SLIME})",),
        DATA,
    ),
    Immune(
        "empty-loss-mask",
        "a sample whose loss mask is all zero (a response of tool output only): a per-sample mean of 0 / 0",
        "slime divides each sample's masked sum by clamp_min(loss_mask.sum(), 1)",
        (
            f"slime/backends/megatron_utils/cp_utils.py:60 ({SLIME})",
            f"slime/backends/megatron_utils/cp_utils.py:86 ({SLIME})",
        ),
        LOSS_NUMERICS,
    ),
    Immune(
        "inf-grad-clip",
        "an inf gradient that gradient clipping turns into NaN parameters (clip coefficient max_norm / inf = 0, "
        "0 x inf = NaN)",
        "with --check-for-nan-in-loss-and-grad (the default) megatron's DDP rejects an inf bucket norm before the "
        "optimizer (the job dies with 'found Inf in local grad norm'); without it slime skips a step whose grad "
        "norm is NaN or inf",
        (
            f"megatron/core/distributed/param_and_grad_buffer.py:195 ({MCORE})",
            f"slime/backends/megatron_utils/model.py:322 ({SLIME})",
        ),
        OPTIMIZER,
    ),
)


def get(name: str) -> Hazard:
    """Look a hazard up by name; an unknown name is a UserError (a ValueError) listing the known ones."""
    if name not in BY_NAME:
        raise UserError(f"unknown hazard {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]


@dataclass
class Rollout:
    """Token-level skeleton of a rollout group, before any log-prob pass.

    tokens[i]: int64 [total_i]; loss_masks[i]: float32 [response_i]; rewards: raw rewards.
    """

    tokens: list[torch.Tensor]
    response_lengths: list[int]
    loss_masks: list[torch.Tensor]
    rewards: list[float]

    @property
    def total_lengths(self) -> list[int]:
        return [t.numel() for t in self.tokens]


def case_rollout(vocab_size: int, seed: int = 0, n_samples: int | None = None, scale: int = 1) -> Rollout:
    """A multi-turn tool-using rollout group shaped like the case, `scale` times the base lengths.

    Each response: model tokens (thinking + tool call), a tool-output span with loss_mask 0, then
    the model's answer. Rewards are 0/1 with at least one of each, so GRPO advantages are non-zero.
    """
    import torch

    n_samples = case.group_size() if n_samples is None else n_samples
    g = torch.Generator().manual_seed(seed)

    def n(lo: int, hi: int) -> int:
        return scale * int(torch.randint(lo, hi + 1, (1,), generator=g))

    tokens, lengths, masks = [], [], []
    for _ in range(n_samples):
        prompt, think, tool, answer = n(8, 14), n(6, 12), n(6, 10), n(4, 8)
        response = think + tool + answer
        tokens.append(torch.randint(0, vocab_size, (prompt + response,), generator=g))
        mask = torch.ones(response)
        mask[think : think + tool] = 0.0
        lengths.append(response)
        masks.append(mask)
    rewards = [float(i % 2) for i in torch.randperm(n_samples, generator=g).tolist()]
    return Rollout(tokens, lengths, masks, rewards)


def synthetic_policy(vocab_size: int, seed: int = 0, logit_std: float = 12.0) -> Policy:
    """A seeded stand-in for an LLM with a realistic logit scale.

    Logits at (sample i, position p) are logit_std * N(0, 1): they span about +-40 units over a
    512-token vocabulary, like a trained LLM's, so at temperature 0.8 the least likely tokens sit near
    logp -100 while typical tokens sit near -50.
    Logits at p do not depend on the tokens, so changing token p+1 leaves them as they are.
    """
    import torch

    def policy(tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        # Sample i's rows come from one generator seeded by (seed, i): row p is the same whatever
        # the sequence length, and no row depends on a token.
        gens = [torch.Generator().manual_seed(seed * 1_000_003 + i) for i in range(len(tokens))]
        return [torch.randn(seq.numel(), vocab_size, generator=g) * logit_std for seq, g in zip(tokens, gens)]

    return policy


def policy_log_probs(logits: list[torch.Tensor], rollout: Rollout, temperature: float) -> list[torch.Tensor]:
    """The log-prob pass: each response token's log-prob under full-vocab logits / temperature.

    Args:
        logits: per sample [total_i, V] float32 at temperature 1.
    Returns:
        per sample [response_i] float32.
    """
    from nanscope.loss.formulas import log_probs

    out = []
    for lg, seq, response in zip(logits, rollout.tokens, rollout.response_lengths):
        total = seq.numel()
        rows = lg[total - response - 1 : total - 1].float() / temperature
        out.append(log_probs(rows, seq[total - response :]))
    return out


def _noisy(x: torch.Tensor, g: torch.Generator, std: float = 0.02) -> torch.Tensor:
    import torch

    return x + std * torch.randn(x.shape, generator=g)


def _masked_positions(rollout: Rollout) -> list[tuple[int, int]]:
    return [(i, int(j)) for i, m in enumerate(rollout.loss_masks) for j in (m == 0).nonzero().flatten()]


def plant_least_likely_tool_token(rollout: Rollout, policy: Policy, temperature: float) -> tuple[int, int]:
    """Make one tool-output token the one the policy finds least likely, from a forward pass.

    Among all masked (tool-output) response positions, picks the one whose least likely vocabulary
    token has the lowest log-prob and writes that token into the sequence. Logits at a position
    depend only on earlier tokens, so the policy's log-prob of the planted token is unchanged by
    the write.

    Returns:
        (sample, response position) of the planted token.
    """
    import torch

    logits = policy(rollout.tokens)
    best = None
    for i, j in _masked_positions(rollout):
        total, response = rollout.tokens[i].numel(), rollout.response_lengths[i]
        row = torch.log_softmax(logits[i][total - response - 1 + j].float() / temperature, dim=-1)
        value, token = row.min(dim=-1)
        if best is None or value < best[0]:
            best = (float(value), i, j, int(token))
    _, i, j, token = best
    rollout.tokens[i][rollout.tokens[i].numel() - rollout.response_lengths[i] + j] = token
    return i, j


def _site(name: str, policy: Policy, rollout: Rollout, temperature: float) -> tuple[int, int | None] | None:
    """Where hazard `name` strikes: (sample, response position), (sample, None) for a whole sample."""
    if name == KL_EXP_OVERFLOW.name:
        return plant_least_likely_tool_token(rollout, policy, temperature)
    if name == RATIO_EXP_OVERFLOW.name:
        # a positive advantage: the clipped branch wins
        i = max(range(len(rollout.rewards)), key=lambda k: rollout.rewards[k])
        return i, int((rollout.loss_masks[i] == 0).nonzero()[0])
    if name == NAN_ROLLOUT_LOGPROB.name:
        return _masked_positions(rollout)[0]
    if name == NAN_REWARD.name:
        return 0, None
    return None


def build(
    name: str, policy: Policy, rollout: Rollout, seed: int = 0, temperature: float | None = None, defused: bool = False
) -> dict:
    """Build hazard `name`'s micro-batch (slime's keys, whole sequences, cp_size 1).

    A level "model" hazard's batch is the healthy one: its fault lives in the model. A hazard with a
    `rollout_temperature` override runs the log-prob pass (log_probs, ref_log_probs) at that temperature;
    rollout_log_probs stay SGLang's, at `temperature`.

    Args:
        name: a hazard name (`get`).
        policy: the policy the loss will be computed with (its log-prob pass gives log_probs).
        rollout: the skeleton; modified in place where the hazard plants a token.
        seed: seeds the reference/rollout noise.
        temperature: the rollout temperature (default: the case's).
        defused: build the same batch (same planted token, same site) but leave the trigger value
            out: the hazard's "clean twin", to compare a fixed run against.

    Returns:
        dict with unconcat_tokens, total_lengths, response_lengths, loss_masks, log_probs,
        ref_log_probs, rollout_log_probs, advantages, plus "hazard_site": (sample, position) or None.
    """
    import torch

    from nanscope.loss.formulas import FP32_EXP_MAX, grpo_normalize

    hazard = get(name)
    temperature = case.temperature() if temperature is None else temperature
    # slime's log-prob pass (old and reference log-probs) runs at the hazard's --rollout-temperature.
    pass_temperature = temperature if defused else hazard.loss_overrides.get("rollout_temperature", temperature)
    g = torch.Generator().manual_seed(seed + 1)
    site = _site(name, policy, rollout, temperature)
    logits = policy(rollout.tokens)
    logp = policy_log_probs(logits, rollout, temperature)
    logp_pass = logp if pass_temperature == temperature else policy_log_probs(logits, rollout, pass_temperature)
    old = [x.clone() for x in logp_pass]
    ref = [_noisy(x, g) for x in logp_pass]
    roll = [torch.where(m.bool(), _noisy(x, g), torch.zeros_like(x)) for x, m in zip(logp, rollout.loss_masks)]
    if name == ROLLOUT_LOGPROB_SHIFT.name and not defused:
        # Misaligned by one token: token j gets token j+1's log-prob, the last one the filler 0.0.
        roll = [torch.cat((x[1:], x.new_zeros(1))) for x in roll]
    rewards = list(rollout.rewards)

    if site is not None and not defused:
        i, j = site
        if name == KL_EXP_OVERFLOW.name:
            # The reference model still finds the tool text plausible; the drifted policy does not.
            assert logp[i][j] < -(FP32_EXP_MAX + 2), (
                f"policy logp {float(logp[i][j]):.1f} of the least likely tool token is not below -90.7: "
                "logit scale too small"
            )
            ref[i][j] = -1.0
        elif name == RATIO_EXP_OVERFLOW.name:
            old[i][j] = logp[i][j] - (FP32_EXP_MAX + 10)
        elif name == NAN_ROLLOUT_LOGPROB.name:
            roll[i][j] = float("nan")
        elif name == NAN_REWARD.name:
            rewards[i] = float("nan")

    normalized = grpo_normalize(torch.tensor(rewards), min(case.group_size(), len(rewards)))
    return {
        "unconcat_tokens": [t.clone() for t in rollout.tokens],
        "total_lengths": rollout.total_lengths,
        "response_lengths": list(rollout.response_lengths),
        "loss_masks": [m.clone() for m in rollout.loss_masks],
        "log_probs": old,
        "ref_log_probs": ref,
        # slime v0.1.0's data path hard-codes rollout log-probs to bfloat16 (backends/utils/data.py).
        "rollout_log_probs": [x.bfloat16() for x in roll],
        "advantages": [torch.full((r,), float(a)) for r, a in zip(rollout.response_lengths, normalized)],
        "rewards": rewards,
        "hazard_site": site,
    }


def packed_logits(policy: Policy, tokens: list[torch.Tensor]) -> torch.Tensor:
    """The policy's logits for a micro-batch packed into one row: [1, sum total_i, V] float32."""
    import torch

    return torch.cat(policy(tokens)).unsqueeze(0).float()


@dataclass(frozen=True)
class Outcome:
    """What a loss did on a hazard's micro-batch (loss only, no model)."""

    name: str
    mechanism: str
    loss: str  # "as-is" or "safe"
    loss_value: float
    loss_finite: bool
    grad_finite: bool
    nan_grad_entries: int  # non-finite (NaN or inf) entries of d loss / d logits
    metrics: dict


def run_loss(name: str, loss: str = "as-is", vocab_size: int = 512, seed: int = 0) -> Outcome:
    """Build hazard `name` against the synthetic policy and push it through a loss, forward and backward.

    The case's loss flags apply, with the hazard's `loss_overrides` on top.

    Args:
        name: a level "batch" hazard (a "model" one needs the harness: `nanscope repro --hazard NAME`).
        loss: "as-is" (slime v0.1.0) or "safe" (nanscope's fix).
    """
    import torch

    from nanscope import loss as losses
    from nanscope.slime_args import case_args

    hazard = get(name)
    if hazard.level != "batch":
        raise UserError(f"hazard {name!r} is a fault in the model, not a batch: run `nanscope repro --hazard {name}`")
    module = losses.get(loss)
    policy = synthetic_policy(vocab_size, seed)
    batch = build(name, policy, case_rollout(vocab_size, seed), seed)
    logits = packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    args = case_args(global_batch_size=len(batch["response_lengths"]), **hazard.loss_overrides)
    value, _, log = module.loss_function(args, batch, 1, logits)
    value.backward()
    bad = int((~torch.isfinite(logits.grad)).sum())
    return Outcome(
        name,
        hazard.mechanism,
        loss,
        float(value.detach()),
        bool(torch.isfinite(value)),
        bad == 0,
        bad,
        dict(zip(log["keys"], log["values"][1:].tolist())),
    )
