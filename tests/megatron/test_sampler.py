"""Batched sampling of a group from a policy, on tiny sizes with a stand-in policy (no megatron)."""

import math

import torch

from nanscope.megatron import sampler
from nanscope.megatron.environment import ToolEnv

V = 512


def _bigram(seed: int = 0):
    """A stand-in policy: the next token's logits [B, V] depend on the last token only; it counts its calls."""
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * 4

    def next_logits(sequences):
        next_logits.calls.append(len(sequences))
        return torch.stack([table[int(seq[-1])] for seq in sequences])

    next_logits.calls = []
    return next_logits


def test_draw_samples_each_row_and_returns_the_log_prob_at_the_temperature():
    logits = torch.tensor([[0.0, 0.0, -1e4], [-1e4, 5.0, -1e4]])
    tokens, logp = sampler.draw(logits, 0.8, torch.Generator().manual_seed(0))
    assert tokens[0] in (0, 1) and tokens[1] == 1
    # row 0: two equal logits -> log(1/2); row 1: one token -> 0
    torch.testing.assert_close(logp, torch.tensor([math.log(0.5), 0.0]))


def test_a_group_is_think_then_the_tools_output_then_answer_one_batched_call_per_token():
    env, policy = ToolEnv(vocab_size=V, seed=1), _bigram()
    group = sampler.sample_group(policy, env, step=2, group_size=8, temperature=0.8,
                                 generator=torch.Generator().manual_seed(5))  # fmt: skip
    r = group.rollout
    # 8 think + 8 answer tokens drawn, each one call for the whole group (batched, not one sample at a time)
    assert policy.calls == [8] * 16
    assert r.group_size == 8 and r.temperature == 0.8 and len(r.tokens) == 8
    prompt = env.prompt(2)
    for seq, response, mask, roll, (start, stop), reward in zip(
        r.tokens, r.response_lengths, r.loss_masks, group.rollout_log_probs, group.spans, r.rewards
    ):
        assert torch.equal(seq[:10], prompt) and seq.numel() == 10 + response
        body = seq[10:]
        call = int(body[start - 1])  # the last thinking token
        assert start == 8 and torch.equal(body[start:stop], env.tool_output(call))
        assert response == 8 + (stop - start) + 8
        # the tool's span is masked and has the rollout log-prob 0.0; every sampled token has its own (< 0)
        assert torch.equal(mask, torch.cat((torch.ones(8), torch.zeros(stop - start), torch.ones(8))))
        assert bool((roll[start:stop] == 0).all()) and bool((roll[mask.bool()] < 0).all())
        assert reward == env.reward(body[-8:])
    assert len(set(r.response_lengths)) > 1  # the tool's output lengths differ by call


def test_sampling_is_a_function_of_the_generator():
    env = ToolEnv(vocab_size=V)
    groups = [sampler.sample_group(_bigram(), env, step=1, group_size=4, temperature=0.8,
                                   generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8)]  # fmt: skip
    same = [all(torch.equal(a, b) for a, b in zip(g.rollout.tokens, groups[0].rollout.tokens)) for g in groups]
    assert same == [True, True, False]


def test_the_sampler_draws_from_the_policys_distribution():
    # one position, many rows: the empirical frequencies approach softmax(logits / T)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).repeat(20000, 1)
    tokens, _ = sampler.draw(logits, 0.8, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=4).float() / 20000
    torch.testing.assert_close(freq, torch.softmax(logits[0] / 0.8, -1), atol=0.01, rtol=0)
