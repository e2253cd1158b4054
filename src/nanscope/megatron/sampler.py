"""Rollouts sampled from the current policy, batched over the group: the natural loop's stand-in for SGLang.

    group = sample_group(next_logits, env, step=i, group_size=8, temperature=0.8, generator=g)

`next_logits(sequences)` maps the group's sequences (lengths may differ) to each one's next-token logits [B, V]
(T = 1). In the harness it is `pipeline_next_logits`: one forward-only pass of megatron-core's pipeline schedule
per sampled token, the whole group as ONE micro-batch [B, S] (padded at the end: causal attention keeps the padding
out of the logits read), through every pipeline stage and TP rank in turn; the last stage gathers the vocabulary
shards and broadcasts the rows over the model-parallel group. No KV cache: each pass recomputes the group's prefix.
Every rank then draws the same tokens from the same rows with the same generator, so the ranks agree on the rollout
without a second collective.

The sampler's log-probs (`Group.rollout_log_probs`) are those of the distribution it sampled from, log_softmax of
logits / T, as SGLang returns them; the environment's tool tokens get 0.0, as the case's generate function fills
them. The policy that samples is the one the log-prob pass then scores, so TIS stays near 1 (SGLang's kernels and
batch would move it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nanscope.hazards import Rollout
from nanscope.megatron.environment import ToolEnv

if TYPE_CHECKING:
    from nanscope.megatron.context import RunContext

# sequences [total_i] int64 -> next-token logits [B, V] float32 at temperature 1
NextLogits = Callable[[list[torch.Tensor]], torch.Tensor]


@dataclass
class Group:
    """One prompt's group of responses, sampled; `rollout` holds tokens, masks and rewards as hazards.Rollout."""

    rollout: Rollout
    rollout_log_probs: list[torch.Tensor]  # per sample [response_i] float32: the sampler's, 0.0 on tool tokens
    spans: list[tuple[int, int]]  # per sample: the tool output's [start, stop) in response positions


def draw(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from softmax(logits / T), and its log-prob there.

    Args:
        logits: [B, V] float32 at temperature 1.
    Returns:
        (tokens [B] int64, log-probs [B] float32).
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    tokens = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def extend(
    next_logits: NextLogits, sequences: list[torch.Tensor], n: int, temperature: float, generator: torch.Generator
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Append `n` sampled tokens to every sequence, one batched `next_logits` call per token.

    Returns:
        (the longer sequences, log-probs [B, n] of the tokens drawn).
    """
    drawn = []
    for _ in range(n):
        tokens, logp = draw(next_logits(sequences), temperature, generator)
        sequences = [torch.cat((seq, token[None])) for seq, token in zip(sequences, tokens)]
        drawn.append(logp)
    return sequences, torch.stack(drawn, dim=1) if drawn else torch.zeros(len(sequences), 0)


def sample_group(
    next_logits: NextLogits,
    env: ToolEnv,
    *,
    step: int,
    group_size: int,
    temperature: float,
    generator: torch.Generator,
) -> Group:
    """Step `step`'s group: its prompt, then per sample think (sampled), the tool's output (inserted), answer (sampled)."""
    prompt = env.prompt(step)
    sequences, think = extend(next_logits, [prompt.clone() for _ in range(group_size)], env.think_tokens,
                              temperature, generator)  # fmt: skip
    outputs = [env.tool_output(int(seq[-1])) for seq in sequences]  # the last thinking token is the call
    spans = [(env.think_tokens, env.think_tokens + out.numel()) for out in outputs]
    sequences = [torch.cat((seq, out)) for seq, out in zip(sequences, outputs)]
    sequences, answer = extend(next_logits, sequences, env.answer_tokens, temperature, generator)
    responses = [seq.numel() - prompt.numel() for seq in sequences]
    masks, sampled = [], []
    for response, (start, stop), k in zip(responses, spans, range(group_size)):
        mask = torch.ones(response)
        mask[start:stop] = 0.0
        masks.append(mask)
        sampled.append(torch.cat((think[k], torch.zeros(stop - start), answer[k])))
    rewards = [env.reward(seq[-env.answer_tokens :]) for seq in sequences]
    rollout = Rollout(sequences, responses, masks, rewards, temperature=temperature, group_size=group_size)
    return Group(rollout, sampled, spans)


def pipeline_next_logits(ctx: RunContext) -> NextLogits:
    """`NextLogits` through the harness's model: a collective of every rank of the data-parallel replica.

    One forward-only pass of the pipeline schedule for the whole group (one micro-batch [B, S], S the longest
    sequence rounded up to a multiple of TP for sequence parallelism); the last stage gathers the vocabulary over
    TP and keeps each sequence's last row; its TP rank 0 broadcasts the rows [B, V] over the model-parallel group.
    """
    import torch.distributed as dist  # heavy: torch.distributed and megatron-core, in the ranks only
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from nanscope.megatron.step import last_stage_tp0

    model, tp = ctx.model, ctx.layout.tp

    def next_logits(sequences: list[torch.Tensor]) -> torch.Tensor:
        lengths = torch.tensor([seq.numel() for seq in sequences])
        width = -(-int(lengths.max()) // tp) * tp
        batch = torch.stack([torch.nn.functional.pad(seq, (0, width - seq.numel())) for seq in sequences])

        def forward_step(it, m):
            out = m(input_ids=next(it), position_ids=None, attention_mask=None, labels=None)

            def keep(logits, non_loss_data=True):
                full = gather_from_tensor_model_parallel_region(logits.float())  # [B, S, V]
                return full[torch.arange(len(sequences)), lengths - 1].detach().clone()

            return out, keep

        model.eval()
        with torch.no_grad():
            store = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter([batch]), model=[model], num_microbatches=1,
                seq_length=width, micro_batch_size=len(sequences), forward_only=True, collect_non_loss_data=True,
            )  # fmt: skip
        model.train()
        src = last_stage_tp0()
        rows = store[0] if dist.get_rank() == src else torch.empty(len(sequences), ctx.vocab_size)
        dist.broadcast(rows, src=src, group=mpu.get_model_parallel_group())
        return rows

    return next_logits
