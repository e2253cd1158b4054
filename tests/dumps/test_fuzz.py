"""Fuzzing the readers: any file either scans or fails with a one-line UserError, never a traceback."""

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanscope import case
from nanscope.dumps import checks, demo, io, writers
from nanscope.errors import UserError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def scan_or_user_error(path, **load) -> str:
    """'ok' if the file scans, else the UserError text (which must be one line). Anything else fails."""
    try:
        checks.scan(io.load(path, **load), case.scan_config(n_samples_per_prompt=2))
        return "ok"
    except UserError as e:
        assert "\n" not in str(e), str(e)
        return str(e)


@SETTINGS
@given(data=st.data())
def test_corrupted_bytes(tmp_path, data):
    good = writers.write_rollout_dump(tmp_path / "good.pt", [demo.rollout_sample(i, 3, 5) for i in range(4)])
    raw = bytearray(good.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(raw[:cut]))
    scan_or_user_error(bad)


numbers = st.one_of(
    st.integers(-3, 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
weird = st.one_of(
    numbers,
    st.lists(numbers, max_size=6),
    st.lists(st.lists(numbers, max_size=2), max_size=3),
    st.lists(st.floats(width=32), max_size=6).map(torch.tensor),
)


def mostly(valid):
    """Valid three times in four, anything otherwise: deep paths get exercised, not just the first check."""
    return st.one_of(valid, valid, valid, weird)


logps = st.lists(st.one_of(st.floats(max_value=0), st.sampled_from([math.nan, -math.inf])), min_size=4, max_size=4)
sample = st.fixed_dictionaries(
    {
        "tokens": mostly(st.lists(st.integers(0, 10), min_size=6, max_size=6)),
        "response_length": mostly(st.integers(0, 6)),
        "reward": mostly(st.one_of(st.floats(), st.dictionaries(st.sampled_from(["a", "b"]), st.floats(), max_size=2))),
    },
    optional={
        "loss_mask": mostly(st.lists(st.integers(0, 1), min_size=4, max_size=4)),
        "rollout_log_probs": mostly(logps),
        "status": st.sampled_from(["completed", 3]),
        "metadata": st.dictionaries(st.text(max_size=2), numbers, max_size=2),
    },
)


@SETTINGS
@given(samples=st.lists(mostly(sample), max_size=4), reward_key=st.sampled_from([None, None, "a"]))
def test_random_rollout_structures(tmp_path, samples, reward_key):
    path = tmp_path / "r.pt"
    torch.save({"rollout_id": 1, "samples": samples}, path)
    scan_or_user_error(path, reward_key=reward_key)


train_keys = [
    "tokens",
    "response_lengths",
    "total_lengths",
    "loss_masks",
    "rewards",
    "log_probs",
    "ref_log_probs",
    "rollout_log_probs",
    "advantages",
]


@SETTINGS
@given(n=st.integers(0, 3), data=st.data(), cp=st.sampled_from([1, 2]))
def test_random_train_structures(tmp_path, n, data, cp):
    rollout_data = {}
    for key in data.draw(st.lists(st.sampled_from(train_keys), unique=True)):
        length = data.draw(st.sampled_from([n, n, n + 1]))
        rollout_data[key] = data.draw(st.lists(weird, min_size=length, max_size=length))
    path = writers.write_train_dump(tmp_path / "t.pt", rollout_data, rank=data.draw(st.integers(0, 7)))
    scan_or_user_error(path, cp_size=cp, tp_size=2)


def test_valid_but_extreme_values_scan(tmp_path):
    s = demo.rollout_sample(0, 2, 4)
    s["rollout_log_probs"] = [math.nan, math.inf, -math.inf, 1e308]
    s["reward"] = 1e308  # overflows float32 in slime's reward tensor
    path = writers.write_rollout_dump(tmp_path / "x.pt", [s, demo.rollout_sample(1, 2, 4)])
    assert scan_or_user_error(path) == "ok"
