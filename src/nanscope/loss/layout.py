"""The one place that maps token positions between a packed micro-batch and each sample's response.

slime packs the samples of a micro-batch into one row. With one context-parallel rank a sample
occupies `total_length` consecutive positions. With cp_size = c > 1 slime uses the zigzag layout:
each sample is padded to a multiple of 2c and cut into 2c chunks of `chunk = ceil(total / 2c)`;
CP rank r holds chunks r and 2c-1-r, so a sample occupies 2*chunk positions of rank r's row.

The logit at sequence position p predicts token p+1, so the response's log-probs come from the
logits at positions [prompt-1, total-1). A chunk holding none of those positions contributes an
empty slice (slime keeps the empty slice so the gradient still flows).

Everything here is integer arithmetic on lengths: no tensors, no process groups.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """A run of consecutive response tokens held by one CP rank.

    logit_start: index of the first logit in the rank's packed row, relative to the sample's start.
    response_start: index of the first token in the sample's response (0-based).
    length: number of tokens.
    """

    logit_start: int
    response_start: int
    length: int


def chunk_size(total_length: int, cp_size: int) -> int:
    """Zigzag chunk length: ceil(total_length / (2 * cp_size))."""
    return (total_length + 2 * cp_size - 1) // (2 * cp_size)


def local_length(total_length: int, cp_size: int) -> int:
    """Positions a sample occupies in one CP rank's packed row."""
    return total_length if cp_size == 1 else 2 * chunk_size(total_length, cp_size)


def segments(total_length: int, response_length: int, cp_rank: int = 0, cp_size: int = 1) -> list[Segment]:
    """The response tokens of one sample that CP rank `cp_rank` holds, in the rank's order.

    Args:
        total_length: prompt + response length of the sample.
        response_length: response length (>= 1).
        cp_rank, cp_size: the context-parallel coordinate; cp_size 1 means no CP.

    Returns:
        Non-empty segments, in the order their log-probs are concatenated on that rank.

    Example (total 10, response 6: logits at positions 3..8 predict response tokens 0..5):
        cp_size 1: [Segment(3, 0, 6)]
        cp_size 2 (chunk 3): rank 0 holds positions 0-2 and 9-11, no response logit -> [];
            rank 1 holds positions 3-5 then 6-8 -> [Segment(0, 0, 3), Segment(3, 3, 3)].
    """
    assert 0 < response_length < total_length, (
        f"response {response_length} needs a prompt token before it (total {total_length})"
    )
    assert 0 <= cp_rank < cp_size, f"cp_rank {cp_rank} outside cp_size {cp_size}"
    prompt_length = total_length - response_length
    if cp_size == 1:
        chunks = [(0, total_length)]
    else:
        c = chunk_size(total_length, cp_size)
        chunks = [(cp_rank * c, (cp_rank + 1) * c), ((2 * cp_size - 1 - cp_rank) * c, (2 * cp_size - cp_rank) * c)]
    out, offset = [], 0
    for begin, end in chunks:
        lo, hi = max(begin, prompt_length - 1), min(end, total_length - 1)
        if lo < hi:
            out.append(Segment(logit_start=offset + lo - begin, response_start=lo + 1 - prompt_length, length=hi - lo))
        offset += end - begin
    return out


def response_positions(total_length: int, response_length: int, cp_rank: int = 0, cp_size: int = 1) -> list[int]:
    """Response token indices (0-based) a CP rank holds, in its concatenation order."""
    return [
        s.response_start + i for s in segments(total_length, response_length, cp_rank, cp_size) for i in range(s.length)
    ]


def sequence_positions(total_length: int, cp_rank: int = 0, cp_size: int = 1) -> list[int]:
    """The sequence positions of a sample in CP rank `cp_rank`'s packed row, in row order.

    Positions >= total_length are zigzag padding. With cp_size 1 this is range(total_length).
    """
    if cp_size == 1:
        return list(range(total_length))
    c = chunk_size(total_length, cp_size)
    first, second = cp_rank * c, (2 * cp_size - 1 - cp_rank) * c
    return list(range(first, first + c)) + list(range(second, second + c))
