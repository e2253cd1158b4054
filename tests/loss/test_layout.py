import pytest

from nanscope.loss import layout
from nanscope.loss.layout import Segment


def test_no_cp_is_the_whole_response():
    # total 10, response 6, prompt 4: logits at positions 3..8 predict response tokens 0..5
    assert layout.segments(10, 6) == [Segment(3, 0, 6)]
    assert layout.local_length(10, 1) == 10


def test_zigzag_cp2_hand_derived():
    # chunk = ceil(10/4) = 3. rank 0: positions 0-2 and 9-11 (10, 11 are padding): no logit in [3, 9).
    assert layout.segments(10, 6, 0, 2) == []
    # rank 1: positions 3-5 (row 0-2) then 6-8 (row 3-5): response tokens 0-2 and 3-5.
    assert layout.segments(10, 6, 1, 2) == [Segment(0, 0, 3), Segment(3, 3, 3)]
    assert layout.local_length(10, 2) == 6
    assert layout.sequence_positions(10, 0, 2) == [0, 1, 2, 9, 10, 11]


def test_zigzag_cp2_response_in_both_chunks():
    # total 8, response 7 (prompt 1): logit positions 0..6; chunk 2.
    # rank 0 holds 0-1 and 6-7 -> logits 0,1 (resp 0,1) and 6 (resp 6).
    assert layout.segments(8, 7, 0, 2) == [Segment(0, 0, 2), Segment(2, 6, 1)]
    # rank 1 holds 2-3 and 4-5 -> resp 2,3 and 4,5, contiguous in its row.
    assert layout.segments(8, 7, 1, 2) == [Segment(0, 2, 2), Segment(2, 4, 2)]


@pytest.mark.parametrize("cp_size", [1, 2, 4])
@pytest.mark.parametrize("total,response", [(2, 1), (5, 4), (13, 4), (64, 63), (7, 2), (9, 1)])
def test_ranks_partition_the_response(total, response, cp_size):
    held = sorted(p for r in range(cp_size) for p in layout.response_positions(total, response, r, cp_size))
    assert held == list(range(response))
    for r in range(cp_size):
        positions = layout.sequence_positions(total, r, cp_size)
        assert len(positions) == layout.local_length(total, cp_size)
        for s in layout.segments(total, response, r, cp_size):
            # the logit row at s.logit_start sits at sequence position prompt - 1 + response_start
            assert positions[s.logit_start] == total - response - 1 + s.response_start


def test_invalid_lengths_are_invariants():
    with pytest.raises(AssertionError):
        layout.segments(3, 3)  # a response needs at least one prompt token before it
