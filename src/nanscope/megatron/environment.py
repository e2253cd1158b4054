"""The natural loop's toy environment: a tool whose output is inserted into every response, and a rule reward.

A response, as a multi-turn tool-using generate function builds it (the case's `deepresearch.generate`):

    prompt      `prompt_tokens` user tokens from the text alphabet [0, V/2)
    think       `think_tokens` sampled by the policy; the last one is the tool call
    tool output the tool's answer to that call, inserted by the environment: loss_mask 0, rollout log-prob 0.0
    answer      `answer_tokens` sampled by the policy after reading the tool's output

The tool is a lookup: the call token picks its output (the same call always gets the same output), 4 to 12 tokens
of the tool alphabet [V/2, V), the markup a search tool returns. The reward is a rule on the answer: the fraction of
its tokens in the text alphabet (answer in prose, not in the tool's markup). GRPO then pays the policy for leaving
the tool alphabet, at every position it writes; nothing trains the tool's spans, which sit in that alphabet.

Everything here is a pure function of the seed, the step and the tokens: every rank of the harness computes the
same prompt, spans and rewards without a collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ToolEnv:
    """The toy environment's sizes (the case's in comments) and seed."""

    vocab_size: int  # 151936
    seed: int = 0
    prompt_tokens: int = 10  # up to 4096
    think_tokens: int = 8  # thinking and tool calls: up to 61440 response tokens in all
    answer_tokens: int = 8
    tool_tokens: tuple[int, int] = (4, 12)  # shortest and longest tool output

    def __post_init__(self):
        assert self.vocab_size >= 4 and self.think_tokens >= 1 and self.answer_tokens >= 1, self
        assert 1 <= self.tool_tokens[0] <= self.tool_tokens[1], self

    @property
    def text_vocab(self) -> int:
        """Token ids below this are text (the reward's alphabet); from it on, the tool's markup."""
        return self.vocab_size // 2

    @property
    def max_length(self) -> int:
        """The longest sequence a response can make: prompt + think + longest tool output + answer."""
        return self.prompt_tokens + self.think_tokens + self.tool_tokens[1] + self.answer_tokens

    def prompt(self, step: int) -> torch.Tensor:
        """[prompt_tokens] int64: step `step`'s prompt (one prompt per step, shared by its group)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, self.text_vocab, (self.prompt_tokens,), generator=g)

    def tool_output(self, call: int) -> torch.Tensor:
        """[n] int64, n in tool_tokens: the tool's output for `call`, from the tool alphabet [V/2, V)."""
        assert 0 <= call < self.vocab_size, call
        g = torch.Generator().manual_seed((self.seed * self.vocab_size + call) * 7919 + 1)
        lo, hi = self.tool_tokens
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return self.text_vocab + torch.randint(0, self.vocab_size - self.text_vocab, (n,), generator=g)

    def reward(self, answer: torch.Tensor) -> float:
        """The rule reward of an answer [answer_tokens]: the fraction of its tokens in the text alphabet, in [0, 1]."""
        return float((answer < self.text_vocab).float().mean()) if answer.numel() else 0.0
