"""nanscope.slime_repro: the checks on what slime's train.py gave (the runs themselves: tests/slime_releases)."""

from __future__ import annotations

from nanscope import case
from nanscope.slime_repro import _as_is
from nanscope.slime_train import flags
from nanscope.slime_train.run import LaunchResult


def _launch(traceback: str) -> LaunchResult:
    plan = flags.Plan(argv=(), kept=(), dropped=(), resized=(), added=())
    return LaunchResult("as-is", plan, 1, 40.0, traceback, "", "tail", [])


def test_a_driver_traceback_through_megatron_that_ends_in_another_error_is_not_the_case():
    """CI, 2026-12-06: the driver's traceback ran through megatron-core's frames and ended in an error that names no
    NaN; parse_traceback gives no failure for it (the frames are read), and the check raised AttributeError on
    None.result: an internal error instead of the run's own output."""
    text = case.text("traceback.txt")
    head, _, _ = text.partition("RuntimeError: Rank 50")
    died = head + "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
    check = _as_is(_launch(died))
    assert (check.message, check.rank, check.ok) == (None, None, False)
    assert check.frames is not None and check.frames.ok
