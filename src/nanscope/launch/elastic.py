"""torch elastic's word on which worker process failed first, read from a log as a stream.

Its agent logs the failure it observed first, by time, among its workers (torch 2.13.0
torch/distributed/elastic/multiprocessing/api.py:1001-1006: `min(result.failures.values(), key=timestamp)`, then
`failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s`), and torchrun's ChildFailedError prints the same
failure as its `Root Cause (first observed failure):` entry, with its global rank (errors/__init__.py:184-200, :248-254:
`rank      : ${rank} (local_rank: ${local_rank})`). That is the process the agent saw exit first: not necessarily the
one whose error began it (a rank that raised may exit after another that a collective broke).

    elastic = Elastic(); elastic.block(block, lines_before); elastic.rank()
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_AGENT = re.compile(rb"failed \(exitcode: (-?\d{1,6})\) local_rank: (\d{1,7}) \(pid: (\d{1,10})\)")
_ROOT = re.compile(rb"Root Cause \(first observed failure\):")
_TABLE_RANK = re.compile(rb"\brank {1,12}: (\d{1,7}) \(local_rank: (\d{1,7})\)")
_TABLE_REACH = 600  # bytes after the Root Cause header its entry's rank line lies in (`[0]:`, time, host, rank)


@dataclass
class Elastic:
    """The agent's first failure line: (local rank, pid, exit code, line); the Root Cause table's: (rank, local rank,
    line). None: not in the log. Bounded: a few numbers whatever the log's length."""

    agent: tuple[int, int, int, int] | None = None
    root: tuple[int, int, int] | None = None
    pending: bool = False  # a Root Cause header ended the last block before its rank line

    def block(self, block: bytes, before: int) -> None:
        """The lines of `block` (the log's lines after `before` of them): the first of each, kept."""
        if self.agent is None and (found := _AGENT.search(block)) is not None:
            line = before + block.count(b"\n", 0, found.start()) + 1
            self.agent = (int(found[2]), int(found[3]), int(found[1]), line)
        if self.root is not None:
            return
        start = 0 if self.pending else None
        if start is None and (header := _ROOT.search(block)) is not None:
            start = header.end()
        if start is None:
            return
        found = _TABLE_RANK.search(block, start, start + _TABLE_REACH)
        self.pending = found is None and len(block) - start < _TABLE_REACH
        if found is not None:
            line = before + block.count(b"\n", 0, found.start()) + 1
            self.root = (int(found[1]), int(found[2]), line)

    def rank(self) -> tuple[int, str, int] | None:
        """The rank the agent observed fail first: (rank, in words, line); the Root Cause table's global rank where
        it gives one, else the agent line's local rank. None: neither in the log."""
        if self.root is not None:
            rank, local, line = self.root
            return rank, f"rank {rank} (local_rank {local})", line
        if self.agent is not None:
            return self.agent[0], f"local_rank {self.agent[0]}", self.agent[3]
        return None

    def sentence(self, other: int | None) -> str | None:
        """The agent's word in one sentence (`other`: a rank an error line names instead; None: none)."""
        said = self.rank()
        if said is None:
            return None
        _, words, line = said
        if self.agent is not None:
            local, pid, code, at = self.agent
            where = f"line {at}: `failed (exitcode: {code}) local_rank: {local} (pid: {pid})`"
            if self.root is not None:
                where += f"; torchrun's Root Cause table, line {self.root[2]}"
        else:
            where = f"torchrun's Root Cause (first observed failure) table, line {line}"
        said = f"torch elastic's agent names {words} as the process it observed fail first ({where})"
        if other is not None and (self.root is None or other != self.root[0]):  # a local rank is its node's own
            return (f"{said}; the error the text shows is rank {other}'s, so the agent's first observed exit is not "
                    "said to be where it began.")  # fmt: skip
        return f"{said}: the rank whose process failed first, as the agent observed it."
