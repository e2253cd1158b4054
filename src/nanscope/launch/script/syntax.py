"""tree-sitter-bash, and what the launch reader takes from a syntax node: its line and its text.

What tree-sitter sees is bounded in time by what was read. Control characters are removed first
(`without_controls`): bash itself drops NUL bytes, and tree-sitter's parse is quadratic on them (25 KB took
5 s, 200 KB over 300 s). Its error recovery is quadratic too on long malformed runs (`)a)a...`, `<<<<...`,
`x=(x=(...`), and so is its memory (`a|a|...|` of 20 KB took 1 GB). A parse gets an allowance of CPU time
(not wall-clock time: a loaded machine does not shorten it) and of memory, both linear in the bytes read
(`bounds.Budget.parse_allowance`); past either it stops with `TooSlow`.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from functools import cache

from nanscope.launch.script.bounds import PARSE_MEMORY, PARSE_MEMORY_PER_BYTE, SNIPPET, Budget

# C0 controls but tab, newline and carriage return (CRLF scripts read as before), and DEL
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CHUNK = 1 << 16  # bytes handed to tree-sitter per read
_MEMORY_EVERY = 16  # progress calls between two looks at the resident memory
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Removed:
    """Control characters removed from a text: how many, how many of them NUL, and the first one's line."""

    count: int
    nul: int
    line: int

    def note(self) -> str:
        """One line for the report."""
        nul = f", {self.nul:,} of them NUL (bash drops NUL bytes too)" if self.nul else ""
        return f"{self.count:,} control character(s) removed before parsing{nul}"


class TooSlow(Exception):
    """tree-sitter did not finish by its deadline; `line` is the 1-based line it had reached."""

    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


@cache
def parser():
    """The bash parser (built once)."""
    import tree_sitter_bash  # heavy: tree-sitter and its bash grammar, loaded on the first parse only
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


def without_controls(text: str) -> tuple[str, Removed | None]:
    """`text` without its control characters (tab, newline and CR stay), and what was removed (None: nothing)."""
    first = _CONTROL.search(text)
    if first is None:
        return text, None
    clean, count = _CONTROL.subn("", text)
    return clean, Removed(count, text.count("\0"), text.count("\n", 0, first.start()) + 1)


def parse(source: bytes, budget: Budget):
    """tree-sitter's tree of `source`; TooSlow once it has taken more CPU time than the reading allows
    (`budget.parse_allowance`), or has grown the process by more than PARSE_MEMORY + PARSE_MEMORY_PER_BYTE per
    byte of `source`."""
    bash = parser()
    start = time.process_time()
    deadline = start + budget.parse_allowance(len(source))
    memory = _resident()
    ceiling = None if memory is None else memory + PARSE_MEMORY + PARSE_MEMORY_PER_BYTE * len(source)
    calls = [0, 0]  # progress calls, the lexer's byte offset

    def read(offset: int, _point) -> bytes:
        return source[offset : offset + _CHUNK]

    def stop(offset: int, _has_error: bool) -> bool:
        calls[0] += 1
        calls[1] = offset
        if time.process_time() > deadline:
            return True
        return ceiling is not None and calls[0] % _MEMORY_EVERY == 0 and (_resident() or 0) > ceiling

    try:
        tree = bash.parse(read, progress_callback=stop)
    except ValueError:  # tree-sitter's "Parsing failed": the callback cancelled it
        bash.reset()  # a cancelled parse would otherwise resume on the next call
        raise TooSlow(source.count(b"\n", 0, calls[1]) + 1) from None
    finally:
        budget.spent(time.process_time() - start)
    # A tree parsed through a callback reads each node's text through it again (a copy of _CHUNK bytes per
    # node); the same source parsed again with that tree as the old one reuses it (a fraction of the first
    # parse) and holds the bytes.
    return bash.parse(source, old_tree=tree)


def _resident() -> int | None:
    """The process's resident memory in bytes (Linux: /proc/self/statm), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def line(node) -> int:
    """The node's 1-based line."""
    return node.start_point[0] + 1


def snippet(node) -> str:
    """The node's source text, cut to SNIPPET characters."""
    if node.end_byte - node.start_byte <= SNIPPET:
        return node.text.decode(errors="replace")
    return node.text[:SNIPPET].decode(errors="replace") + "..."


def error_lines(root) -> list[int]:
    """1-based lines of tree-sitter's error and missing nodes (iterative: trees can be deep)."""
    lines, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            lines.add(line(node))
        stack.extend(child for child in node.children if child.has_error or child.type == "ERROR" or child.is_missing)
    return sorted(lines)
