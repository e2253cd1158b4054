"""nanscope.verl_plugin.skips: skip mode's count, its limit, and the learning rate it holds.

The package installs into verl when imported: plain `pytest` without verl skips this module.
"""

import pytest

pytest.importorskip("verl")

from nanscope.verl_plugin.skips import Skips  # noqa: E402


def test_a_skipped_step_is_taken_once_and_holds_the_schedule_when_nothing_was_applied():
    s = Skips(max_skips=None)
    s.record(True)
    assert s.take() is True and s.take() is False  # the next optimizer step only
    s2 = Skips(max_skips=None)
    s2.record(True)
    s2.take()
    assert s2.advance_lr() is False  # the update's only step was skipped: the schedule holds
    assert s2.advance_lr() is True  # a later update with nothing recorded advances


def test_the_schedule_advances_when_some_step_of_the_update_was_applied():
    s = Skips(max_skips=None)
    s.record(True)
    s.take()
    s.record(False)
    s.take()
    assert s.advance_lr() is True
    assert s.skipped == 1 and s.in_a_row == 0


def test_max_skips_counts_steps_in_a_row():
    s = Skips(max_skips=2)
    s.record(True)
    assert not s.over_limit()
    s.record(False)
    s.record(True)
    assert not s.over_limit()
    s.record(True)
    assert s.over_limit() and s.skipped == 3 and s.in_a_row == 2
