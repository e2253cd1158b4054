"""Case-shaped hazard batches: rollout groups built the way slime's passes build them, one hazard planted.

Each batch is built the way slime's passes would have produced it, from a policy (any function
from token sequences to full-vocabulary logits: the synthetic one below, or the tiny megatron
model of the harness):

    rollout      `group_size` samples of one prompt (n-samples-per-prompt), sampled at `temperature`,
                 multi-turn: model tokens (loss_mask 1) around a tool-output span (loss_mask 0)
    log_probs    the policy's own log-probs of the tokens at the rollout temperature (the log-prob pass;
                 one optimizer step per rollout in the case, so old == current policy)
    ref_log_probs  the reference model's: the policy's plus small noise (it has not drifted far)
    rollout_log_probs  SGLang's: the policy's plus small noise on model tokens; 0.0 on tool-output
                 tokens, as multi-turn generate functions fill them; bfloat16, as slime stores them
    advantages   GRPO: raw rewards normalised per group (mean, std + 1e-6), broadcast per token

The hazard (a record of `nanscope.causes.catalogue`) then changes one thing, at one token or sample, or one
loss flag. The temperature, the group size and the loss flags are arguments: the case's come from
`nanscope.case`, which the entry points read once.

    from nanscope import case, hazards
    batch = hazards.build("kl-exp-overflow", policy, case.rollout(512))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import torch

from nanscope import loss as losses
from nanscope.causes.catalogue import (
    KL_EXP_OVERFLOW,
    LOGPROB_DRIFT,
    NAN_REWARD,
    NAN_ROLLOUT_LOGPROB,
    RATIO_EXP_OVERFLOW,
    ROLLOUT_LOGPROB_SHIFT,
    get,
)
from nanscope.errors import UserError
from nanscope.facts.args import loss_args
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.loss.formulas import grpo_normalize, log_probs
from nanscope.trace.tracer import replay

# A policy maps per-sample token sequences [total_i] to full-vocabulary logits [total_i, V] (T = 1).
Policy: TypeAlias = Callable[[list[torch.Tensor]], list[torch.Tensor]]


@dataclass
class Rollout:
    """Token-level skeleton of a rollout group, before any log-prob pass.

    tokens[i]: int64 [total_i]; loss_masks[i]: float32 [response_i]; rewards: raw rewards;
    temperature: what SGLang sampled at (--rollout-temperature); group_size: samples per prompt, the
    groups GRPO normalises over (--n-samples-per-prompt).
    """

    tokens: list[torch.Tensor]
    response_lengths: list[int]
    loss_masks: list[torch.Tensor]
    rewards: list[float]
    temperature: float
    group_size: int

    @property
    def total_lengths(self) -> list[int]:
        return [t.numel() for t in self.tokens]


def shape(flags: Mapping[str, object]) -> dict:
    """A rollout's temperature and group size from slime's loss flags, as `case_rollout` takes them."""
    return {"temperature": float(flags["rollout_temperature"]), "group_size": int(flags["n_samples_per_prompt"])}


def case_rollout(
    vocab_size: int,
    seed: int = 0,
    *,
    temperature: float,
    group_size: int,
    n_samples: int | None = None,
    scale: int = 1,
) -> Rollout:
    """A multi-turn tool-using rollout group shaped like the case, `scale` times the base lengths.

    Each response: model tokens (thinking + tool call), a tool-output span with loss_mask 0, then
    the model's answer. Rewards are 0/1 with at least one of each, so GRPO advantages are non-zero.
    `n_samples` (default `group_size`) samples are drawn.
    """
    n_samples = group_size if n_samples is None else n_samples
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
    return Rollout(tokens, lengths, masks, rewards, temperature=temperature, group_size=group_size)


def synthetic_policy(vocab_size: int, seed: int = 0, logit_std: float = 12.0) -> Policy:
    """A seeded stand-in for an LLM with a realistic logit scale.

    Logits at (sample i, position p) are logit_std * N(0, 1): they span about +-40 units over a
    512-token vocabulary, like a trained LLM's, so at temperature 0.8 the least likely tokens sit near
    logp -100 while typical tokens sit near -50.
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
    if name in (KL_EXP_OVERFLOW.name, LOGPROB_DRIFT.name):
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
    name: str,
    policy: Policy,
    rollout: Rollout,
    seed: int = 0,
    temperature: float | None = None,
    defused: bool = False,
    *,
    progress: float = 1.0,
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
        temperature: the rollout temperature (default: the rollout's).
        defused: build the same batch (same planted token, same site) but leave the trigger value
            out: the hazard's "clean twin", to compare a fixed run against.
        progress: a drifting hazard (logprob-drift): how far along its drift the step is, 1 at the step it
            crosses (the KL log-ratio at the site is progress x (88.72 + 10)).

    Returns:
        dict with unconcat_tokens, total_lengths, response_lengths, loss_masks, log_probs,
        ref_log_probs, rollout_log_probs, advantages, plus "hazard_site": (sample, position) or None.
    """
    hazard = get(name)
    temperature = rollout.temperature if temperature is None else temperature
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
        elif name == LOGPROB_DRIFT.name:  # ref - logp grows to FP32_EXP_MAX + 10 at progress 1
            ref[i][j] = logp[i][j] + progress * (FP32_EXP_MAX + 10)
        elif name == RATIO_EXP_OVERFLOW.name:
            old[i][j] = logp[i][j] - (FP32_EXP_MAX + 10)
        elif name == NAN_ROLLOUT_LOGPROB.name:
            roll[i][j] = float("nan")
        elif name == NAN_REWARD.name:
            rewards[i] = float("nan")

    batch = slime_batch(rollout, log_probs=old, ref_log_probs=ref, rollout_log_probs=roll, rewards=rewards)
    return {**batch, "hazard_site": site}


def slime_batch(
    rollout: Rollout,
    *,
    log_probs: list[torch.Tensor],
    ref_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    rewards: list[float],
) -> dict:
    """A rollout group and its log-prob passes as slime's batch: GRPO advantages from `rewards`, per sample.

    Args:
        log_probs, ref_log_probs, rollout_log_probs: per sample [response_i] float32.
    Returns:
        dict with unconcat_tokens, total_lengths, response_lengths, loss_masks, log_probs, ref_log_probs,
        rollout_log_probs (bfloat16), advantages, rewards.
    """
    normalized = grpo_normalize(torch.tensor(rewards), min(rollout.group_size, len(rewards)))
    return {
        "unconcat_tokens": [t.clone() for t in rollout.tokens],
        "total_lengths": rollout.total_lengths,
        "response_lengths": list(rollout.response_lengths),
        "loss_masks": [m.clone() for m in rollout.loss_masks],
        "log_probs": log_probs,
        "ref_log_probs": ref_log_probs,
        # slime v0.1.0's data path hard-codes rollout log-probs to bfloat16 (backends/utils/data.py).
        "rollout_log_probs": [x.bfloat16() for x in rollout_log_probs],
        "advantages": [torch.full((r,), float(a)) for r, a in zip(rollout.response_lengths, normalized)],
        "rewards": list(rewards),
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


def run_loss(name: str, loss: str = "as-is", *, flags: Mapping[str, object], vocab_size: int = 512, seed: int = 0):
    """Build hazard `name` against the synthetic policy and push it through a loss, forward and backward.

    Args:
        name: a level "batch" hazard (a "model" one needs the harness: `nanscope repro --hazard NAME`).
        loss: "as-is" (slime v0.1.0) or "safe" (nanscope's fix).
        flags: slime's loss flags (the case's); the hazard's `loss_overrides` apply on top.

    Returns:
        An Outcome.
    """
    hazard = get(name)
    if hazard.level != "batch":
        raise UserError(f"hazard {name!r} is a fault in the model, not a batch: run `nanscope repro --hazard {name}`")
    module = losses.get(loss)
    policy = synthetic_policy(vocab_size, seed)
    batch = build(name, policy, case_rollout(vocab_size, seed, **shape(flags)), seed)
    logits = packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    args = loss_args(**{**flags, "global_batch_size": len(batch["response_lengths"]), **hazard.loss_overrides})
    value, _, log = module.loss_function(args, batch, 1, logits)
    value.backward()
    bad = int((~torch.isfinite(logits.grad)).sum())
    return Outcome(
        name=name,
        mechanism=hazard.mechanism,
        loss=loss,
        loss_value=float(value.detach()),
        loss_finite=bool(torch.isfinite(value)),
        grad_finite=bad == 0,
        nan_grad_entries=bad,
        metrics=dict(zip(log["keys"], log["values"][1:].tolist())),
    )


def microbatch_document(
    name: str, loss: str = "as-is", *, flags: Mapping[str, object], seed: int = 0, vocab_size: int = 512
):
    """A catalogued hazard's micro-batch as a `nanscope.trace.tracer.replay` document (as `run_loss` builds it).

    Returns:
        (document, hazard site (sample, response position) or None).
    """
    policy = synthetic_policy(vocab_size, seed)
    batch = build(name, policy, case_rollout(vocab_size, seed, **shape(flags)), seed)
    logits = packed_logits(policy, batch["unconcat_tokens"])
    overrides = get(name).loss_overrides  # a hazard that is a flag value (zero-temperature)
    args = {**flags, **overrides, "global_batch_size": len(batch["response_lengths"])}
    return replay.document(batch, logits, args, loss), batch["hazard_site"]
