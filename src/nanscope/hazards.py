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

A hazard then changes one thing, at one token or sample, the way it happens in a real run.

    python -c "from nanscope import hazards; print([h.name for h in hazards.CATALOGUE])"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from nanscope import case
from nanscope.errors import UserError
from nanscope.loss.formulas import FP32_EXP_MAX, grpo_normalize, log_probs

# A policy maps per-sample token sequences [total_i] to full-vocabulary logits [total_i, V] (T = 1).
Policy = Callable[[list[torch.Tensor]], list[torch.Tensor]]

@dataclass(frozen=True)
class Hazard:
    """One catalogue entry. `loss_finite` / `grad_finite` are what slime v0.1.0 produces on it.

    Attributes:
        name: the hazard's one spelling (CLI, JSON, scan's mechanisms, doctor's findings).
        mechanism: the chain of ops from the trigger to the non-finite value, in words.
        flags: the case's flags that enable it.
        loss_finite, grad_finite: slime v0.1.0's loss on the hazard's batch.
        masked_token: the trigger sits on a masked (loss_mask 0) token, so the fix must leave the step
            exactly as it is on the hazard's defused twin.
    """

    name: str
    mechanism: str
    flags: tuple[str, ...]
    loss_finite: bool
    grad_finite: bool
    masked_token: bool = False


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
)
NAN_REWARD = Hazard(
    "nan-reward",
    "The custom reward function returns NaN for one sample; GRPO group normalisation (mean, std) spreads it "
    "to all 8 samples of the prompt, every advantage of the group is NaN: NaN loss and gradient.",
    ("--custom-rm-path", "--advantage-estimator grpo", "--n-samples-per-prompt 8"),
    loss_finite=False,
    grad_finite=False,
)

CATALOGUE: tuple[Hazard, ...] = (HEALTHY, KL_EXP_OVERFLOW, RATIO_EXP_OVERFLOW, NAN_ROLLOUT_LOGPROB, NAN_REWARD)
BY_NAME = {h.name: h for h in CATALOGUE}


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
    512-token vocabulary, like a trained LLM's, so at temperature 0.8 the least likely tokens sit near logp -100 while typical tokens sit near -50.
    Logits at p do not depend on the tokens, so changing token p+1 leaves them as they are.
    """

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
    out = []
    for lg, seq, response in zip(logits, rollout.tokens, rollout.response_lengths):
        total = seq.numel()
        rows = lg[total - response - 1 : total - 1].float() / temperature
        out.append(log_probs(rows, seq[total - response :]))
    return out


def _noisy(x: torch.Tensor, g: torch.Generator, std: float = 0.02) -> torch.Tensor:
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
        i = max(range(len(rollout.rewards)), key=lambda k: rollout.rewards[k])  # positive advantage: clipped branch wins
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

    Args:
        name: a catalogue name.
        policy: the policy the loss will be computed with (its log-prob pass gives log_probs).
        rollout: the skeleton; modified in place where the hazard plants a token.
        seed: seeds the reference/rollout noise.
        defused: build the same batch (same planted token, same site) but leave the trigger value
            out: the hazard's "clean twin", to compare a fixed run against.

    Returns:
        dict with unconcat_tokens, total_lengths, response_lengths, loss_masks, log_probs,
        ref_log_probs, rollout_log_probs, advantages, plus "hazard_site": (sample, position) or None.
    """
    get(name)
    temperature = case.temperature() if temperature is None else temperature
    g = torch.Generator().manual_seed(seed + 1)
    site = _site(name, policy, rollout, temperature)
    logp = policy_log_probs(policy(rollout.tokens), rollout, temperature)
    old = [x.clone() for x in logp]
    ref = [_noisy(x, g) for x in logp]
    roll = [torch.where(m.bool(), _noisy(x, g), torch.zeros_like(x)) for x, m in zip(logp, rollout.loss_masks)]
    rewards = list(rollout.rewards)

    if site is not None and not defused:
        i, j = site
        if name == KL_EXP_OVERFLOW.name:
            # The reference model still finds the tool text plausible; the drifted policy does not.
            assert logp[i][j] < -(FP32_EXP_MAX + 2), (
                f"policy logp {float(logp[i][j]):.1f} of the least likely tool token is not below -90.7: logit scale too small"
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

    Args:
        loss: "as-is" (slime v0.1.0) or "safe" (nanscope's fix).
    """
    from nanscope import loss as losses
    from nanscope.slime_args import case_args

    module = losses.get(loss)
    policy = synthetic_policy(vocab_size, seed)
    batch = build(name, policy, case_rollout(vocab_size, seed), seed)
    logits = packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    args = case_args(global_batch_size=len(batch["response_lengths"]))
    value, _, log = module.loss_function(args, batch, 1, logits)
    value.backward()
    bad = int((~torch.isfinite(logits.grad)).sum())
    return Outcome(
        name, get(name).mechanism, loss, float(value.detach()), bool(torch.isfinite(value)), bad == 0, bad,
        dict(zip(log["keys"], log["values"][1:].tolist())),
    )
