"""A release run without slime's checkouts says how many tests it did not run (issue 42, newcomer item 8)."""

from types import SimpleNamespace

from tests import checkouts


def test_the_summary_counts_the_tests_skipped_for_want_of_a_checkout():
    skipped = [
        SimpleNamespace(longrepr=("f.py", 1, f"Skipped: {checkouts.NO_SLIME}")),
        SimpleNamespace(longrepr=("f.py", 2, "Skipped: no slime checkout for v0.2.4 at /x/v0.2.4")),
        SimpleNamespace(longrepr=("f.py", 3, "Skipped: nanscope's CPU model is of slime v0.1.0")),
    ]
    assert (
        checkouts.not_tested_line(skipped) == f"NOT TESTED: 2 tests SKIPPED for want of a checkout; {checkouts.WHERE}"
    )
    assert checkouts.not_tested_line(skipped[2:]) is None
