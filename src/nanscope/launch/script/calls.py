"""The shell functions a launch script defines, read where the script calls them, never executed.

A call `launch 4 y` reads the body of `launch() { ... }` (as defined by then) with `$1`, `"$@"`, `$#` set to
the call's words; `local` (and `declare` without `-g`) names get their old values back when the call
returns, `shift` and `return` do what bash does. Calls nest at most MAX_CALLS deep (a recursive function stops
there, with a note); every statement read in a call counts against the reading's bounds as any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nanscope.launch.script.bounds import MAX_CALLS, Budget
from nanscope.launch.script.expansion import Expander
from nanscope.launch.script.syntax import line


class Return(Exception):
    """`return`: the rest of the function's body (or the sourced file) is not read."""


@dataclass
class Function:
    """A `name() { ... }` or `function name { ... }` definition."""

    name: str
    body: object  # its tree-sitter node
    line: int
    calls: int = 0


@dataclass
class _Frame:
    """One call being read: the names it made local, with the value each had before (None: unset)."""

    saved: dict = field(default_factory=dict)


class Calls:
    """The functions defined so far, and the calls being read.

    Args:
        words: the reader's variables and expansions (its `positional` is set during a call).
        budget: the reading's bounds.
        run: reads one statement (the interpreter's).
    """

    def __init__(self, words: Expander, budget: Budget, run: Callable[[object], None]):
        self.words = words
        self.budget = budget
        self.run = run
        self.functions: dict[str, Function] = {}
        self.frames: list[_Frame] = []

    def define(self, node) -> None:
        name, body = node.child_by_field_name("name"), node.child_by_field_name("body")
        if name is not None and body is not None:
            self.functions[name.text.decode()] = Function(name.text.decode(), body, line(node))

    def call(self, words: list[str], node) -> bool:
        """Read the body of the function `words[0]` names with `words[1:]` as its arguments; False if none does."""
        function = self.functions.get(words[0]) if words else None
        if function is None:
            return False
        function.calls += 1
        if len(self.frames) >= MAX_CALLS:
            self.budget.note(line(node), f"`{words[0]}`: function calls nested more than {MAX_CALLS} deep: not read")
            return True
        frame, outer = _Frame(), self.words.positional
        self.frames.append(frame)
        self.words.positional = words[1:]
        try:
            self.run(function.body)
        except Return:
            pass
        finally:
            self.words.positional = outer
            self.frames.pop()
            for name, old in reversed(frame.saved.items()):
                if old is None:
                    self.words.vars.pop(name, None)
                else:
                    self.words.vars[name] = old
        return True

    def keep_local(self, name: str) -> None:
        """`local name` inside a call: its value is restored when the call returns."""
        if self.frames and name not in self.frames[-1].saved:
            self.frames[-1].saved[name] = self.words.vars.get(name)

    def shift(self, words: list[str]) -> None:
        """`shift [n]` inside a call."""
        if self.words.positional is not None:
            count = int(words[1]) if len(words) > 1 and words[1].isdigit() and len(words[1]) < 6 else 1
            self.words.positional = self.words.positional[count:]

    def uncalled_hint(self) -> str:
        """For a script without a train command: the functions that hold one but are never called ('' if none)."""
        idle = [
            f"`{function.name}` (line {function.line})"
            for function in self.functions.values()
            if not function.calls and b"python" in function.body.text
        ]
        if not idle:
            return ""
        return f" (defined but never called: {', '.join(idle[:5])}, which run python)"
