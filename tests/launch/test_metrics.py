"""launch.metrics: a value is an excursion exactly when it is past its metric's range, however it is written (the
scan's textual pre-check, `quick` then `big`, may only pass over values within the range)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from nanscope.launch.metrics import RANGES, Metrics

_FORMATS = ("{!r}", "{:.6g}", "{:E}", "{:.4f}", "{:e}", "{:.2E}")
_LINES = {
    "grad_norm": "step {step}: {{'train/loss': 0.5, 'train/grad_norm': {value}}}",
    "train_rollout_logprob_abs_diff": "step {step}: {{'train/train_rollout_logprob_abs_diff': {value}}}",
    "kl": "step:{step} - actor/kl_loss:{value} - actor/pg_loss:0.1",
    "entropy": "step:{step} - actor/entropy_loss:{value}",
    "loss": " iteration {step}/ 5000 | lm loss: {value} | grad norm: 1.000 |",
}


def _past(metric: str, text: str) -> bool:
    value = float(text)
    return not math.isfinite(value) or abs(value) > RANGES[metric].bound


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(_LINES)),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e6, 1e6), st.integers(-(10**9), 10**9)),
    st.sampled_from(_FORMATS),
)
def test_an_excursion_is_a_value_past_the_range(metric, value, form):
    text = form.format(float(value)) if not isinstance(value, int) or form != "{!r}" else str(value)
    metrics = Metrics()
    metrics.scan(("noise 12:01:05 pid=2526001\n" + _LINES[metric].format(step=7, value=text) + "\n").encode(), 0)
    assert metrics.seen and metrics.first_step == 7
    found = metrics.excursions.get(metric)
    assert (found is not None) == _past(metric, text), (metric, text)
    if found is not None:
        assert (found.step, found.line) == (7, 2)


def test_the_first_excursion_is_kept_and_a_checkpoint_load_before_it_is_named():
    log = (
        "loading checkpoint from /ckpt/iter_0000100\n"
        "step 101: {'train/grad_norm': 0.7}\n"
        "step 102: {'train/grad_norm': 2.5e+05}\n"
        "step 103: {'train/grad_norm': nan}\n"
    )
    metrics = Metrics()
    metrics.scan(log.encode(), 10)
    excursion = metrics.excursions["grad_norm"]
    assert (excursion.step, excursion.value, excursion.line, metrics.load_line) == (102, 2.5e5, 13, 11)
    assert metrics.after_load(excursion)
    assert excursion.text() == "grad_norm left its range at step 102: 250000 (past 10000; range: finite, <= 1e4)"
