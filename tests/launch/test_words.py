"""Counted nouns (`launch.words.count`): never "1 nodes", "1 bundles" or "1 dumps" (issue 42 item 9)."""

from nanscope.launch.words import count


def test_a_count_agrees_with_its_noun():
    assert [count(n, "bundle") for n in (0, 1, 2)] == ["0 bundles", "1 bundle", "2 bundles"]
    assert count(3, "process", "processes") == "3 processes" and count(1.5, "node") == "1.5 nodes"
    assert count(2048, "sample", grouped=True) == "2,048 samples" and count(2048, "sample") == "2048 samples"
