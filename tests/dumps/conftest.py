"""Shared builders for the dump tests: small synthetic rollout samples."""

import numpy as np
import pytest

from nanscope.dumps import demo


@pytest.fixture
def make_samples():
    """make_samples(n, prompt=4, response=8) -> clean Sample.to_dict() dicts (rewards alternate 0/1)."""

    def make(n: int, prompt: int = 4, response: int = 8) -> list[dict]:
        rng = np.random.default_rng(0)
        return [demo.rollout_sample(i, prompt, response, reward=float(i % 2), rng=rng) for i in range(n)]

    return make
