"""tree-sitter-bash, and what the launch reader takes from a syntax node: its line and its text."""

from __future__ import annotations

from functools import cache

from nanscope.launch.script.bounds import SNIPPET


@cache
def parser():
    """The bash parser (built once)."""
    import tree_sitter_bash  # heavy: tree-sitter and its bash grammar, loaded on the first parse only
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


def line(node) -> int:
    """The node's 1-based line."""
    return node.start_point[0] + 1


def snippet(node) -> str:
    """The node's source text, cut to SNIPPET characters."""
    if node.end_byte - node.start_byte <= SNIPPET:
        return node.text.decode(errors="replace")
    return node.text[:SNIPPET].decode(errors="replace") + "..."
