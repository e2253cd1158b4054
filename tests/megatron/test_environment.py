"""The natural loop's toy environment: prompts, the tool's output and the rule reward are pure functions of the seed."""

import pytest
import torch

from nanscope.megatron.environment import ToolEnv


def test_prompts_are_text_and_differ_by_step_and_seed():
    env = ToolEnv(vocab_size=512, seed=3)
    a, b = env.prompt(1), env.prompt(2)
    assert a.shape == (10,) and a.dtype == torch.int64 and bool((a < 256).all() and (a >= 0).all())
    assert torch.equal(a, ToolEnv(vocab_size=512, seed=3).prompt(1))  # every rank computes the same prompt
    assert not torch.equal(a, b) and not torch.equal(a, ToolEnv(vocab_size=512, seed=4).prompt(1))


def test_the_tool_is_a_lookup_into_its_own_alphabet():
    env = ToolEnv(vocab_size=512, seed=0)
    outputs = [env.tool_output(call) for call in range(512)]
    # the same call always gets the same output, 4 to 12 tokens of the upper half [256, 512)
    assert all(torch.equal(out, env.tool_output(call)) for call, out in enumerate(outputs))
    assert {out.numel() for out in outputs} == set(range(4, 13))
    assert all(bool((out >= 256).all() and (out < 512).all()) for out in outputs)
    assert len({tuple(out.tolist()) for out in outputs}) == 512
    with pytest.raises(AssertionError):
        env.tool_output(512)


def test_max_length_is_the_longest_response_with_its_prompt():
    # 10 prompt + 8 think + 12 tool + 8 answer
    assert ToolEnv(vocab_size=512).max_length == 38


@pytest.mark.parametrize(
    "answer,reward",
    [
        ([0, 1, 2, 255, 3, 4, 5, 6], 1.0),  # every token text (< 256)
        ([256, 511, 300, 400, 0, 1, 2, 3], 0.5),  # 4 of 8
        ([256] * 8, 0.0),
        ([], 0.0),
    ],
)
def test_reward_is_the_fraction_of_answer_tokens_in_the_text_alphabet(answer, reward):
    assert ToolEnv(vocab_size=512).reward(torch.tensor(answer, dtype=torch.int64)) == reward
