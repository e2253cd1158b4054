"""Rank coordinates and groups of a megatron-core layout, by arithmetic: nanscope's own generator.

megatron-core's `RankGenerator` (parallel_state.py, core_v0.15.0rc0) numbers the ranks in mixed radix over the
parallel sizes in its `order` (`tp-cp-ep-dp-pp`: tp fastest), and a group of one kind (tp, dp, ...) is the ranks
that differ only in that kind's digit. Megatron lists every group of every kind (work and memory in the world's
size, and an import of megatron-core: seconds); here a rank's digit is `(rank // stride) % size` and its group one
`range` (`start, start + stride, ...`), so a world of 2^20 ranks costs what a world of 8 does. tests/launch/
test_ranks.py checks every coordinate, group and group index against megatron-core's own generator over a grid of
layouts.

    grid = Grid.of("tp-cp-ep-dp-pp", tp=4, cp=2, ep=1, dp=2, pp=4)
    grid.coord(50, "pp")    # 3
    grid.group(50, "tp")    # range(48, 52)
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class Grid:
    """One generator's digits, fastest first: (kind, size, stride)."""

    digits: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, order: str, **sizes: int) -> Grid:
        """The generator of `order` (kinds joined by `-`); a kind the order leaves out must have size 1 and is
        appended, as megatron-core appends it.

        Raises:
            ValueError: a size below 1, an unknown or repeated kind, a kind of size > 1 the order leaves out.
        """
        names = order.lower().split("-")
        if len(set(names)) != len(names) or any(name not in KINDS for name in names):
            raise ValueError(f"order {order!r}: expected distinct kinds of {', '.join(KINDS)}")
        for kind, size in sizes.items():
            if kind not in KINDS or size < 1:
                raise ValueError(f"{kind} {size}: expected a kind of {', '.join(KINDS)} of size >= 1")
            if kind not in names and size != 1:
                raise ValueError(f"{kind} {size}: the order {order!r} leaves it out, so its size must be 1")
        digits, stride = [], 1
        for kind in names + [kind for kind in KINDS if kind not in names]:
            size = sizes.get(kind, 1)
            digits.append((kind, size, stride))
            stride *= size
        return cls(tuple(digits))

    @property
    def world(self) -> int:
        _, size, stride = self.digits[-1]
        return size * stride

    def _digit(self, kind: str) -> tuple[int, int]:
        for name, size, stride in self.digits:
            if name == kind:
                return size, stride
        raise KeyError(kind)

    def size(self, kind: str) -> int:
        return self._digit(kind)[0]

    def stride(self, kind: str) -> int:
        """How far apart two ranks of one `kind` group are."""
        return self._digit(kind)[1]

    def coord(self, rank: int, kind: str) -> int:
        """The rank's index in its `kind` group (its tp rank, dp rank, ...)."""
        size, stride = self._digit(kind)
        return rank // stride % size

    def group(self, rank: int, kind: str) -> range:
        """The ranks of `rank`'s `kind` group, in the order megatron-core lists them."""
        size, stride = self._digit(kind)
        start = rank - rank // stride % size * stride
        return range(start, start + size * stride, stride)

    def members(self, rank: int, kinds: tuple[str, ...]) -> list[int]:
        """The ranks of `rank`'s group over several kinds (`("dp", "cp")`: its dp-cp group), in megatron-core's order
        (the kinds' digits in mixed radix, fastest first): a list as long as the product of their sizes."""
        digits = [(size, stride) for name, size, stride in self.digits if name in kinds]
        out = [rank - sum(rank // stride % size * stride for size, stride in digits)]
        for size, stride in digits:
            out = [first + i * stride for i in range(size) for first in out]
        return out

    def group_index(self, rank: int, kind: str) -> int:
        """Which of the `kind` groups holds `rank`, numbered as megatron-core lists them (the other digits in mixed
        radix, fastest first)."""
        index, scale = 0, 1
        for name, size, stride in self.digits:
            if name != kind:
                index += rank // stride % size * scale
                scale *= size
        return index
