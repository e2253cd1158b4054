"""A bundle holds at most MAX_MICROBATCHES micro-batches: the sentinel's first, then the others in order."""

from nanscope.slime_plugin import bundles


def test_the_sentinels_micro_batches_are_kept_first_and_the_rest_counted():
    why = {i: ["nonfinite-loss"] for i in range(10)}
    why[7] = ["sentinel-backward", "nonfinite-loss"]
    kept, left_out = bundles.keep(why)
    assert list(kept) == [0, 1, 2, 7] and kept[7] == why[7] and left_out == 6
    assert bundles.keep({0: ["sentinel-forward"]}) == ({0: ["sentinel-forward"]}, 0)
    assert bundles.keep({}) == ({}, 0)
