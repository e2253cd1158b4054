"""Walking a launch script's syntax tree in order, as bash would run it, without running anything.

Read: scalar and array assignments (`X=( ... )` with comments and line continuations, `+=`),
`export`/`declare`, `source FILE` / `. FILE` (followed, or a `--model-args` file read in its place),
`if`/`elif`/`else` on `[ ... ]` tests of known values (an undecidable test is assumed true, said in
`assumptions`), and every command's words, to find the train command. Function bodies, heredocs and
other command substitutions are not run. Words are expanded by `expansion.Expander`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from nanscope import inputs
from nanscope.launch.script.arithmetic import compare
from nanscope.launch.script.bounds import MAX_SOURCES, OPTION, Budget, Cap
from nanscope.launch.script.expansion import Expander
from nanscope.launch.script.syntax import line, parser, snippet

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")


@dataclass
class Source:
    """One `source FILE` statement: the path as written and what happened to it."""

    path: str
    line: int
    status: str  # "followed" | "missing"
    followed: str | None = None  # the file read in its place (--model-args)


@dataclass
class TrainCommand:
    """The `python3 <train script>.py ...` command: its script, its arguments, the words before it, its line."""

    script: str
    argv: list[str]
    launcher: list[str]
    line: int


class Interpreter:
    """Walks the syntax tree in order, keeping the shell variables (in `words`).

    Args:
        env: initial variables (the `--env K=V` values).
        model_args: a file to read in place of the first `source` that cannot be found.
        limit: the most bytes of one file read.
    """

    def __init__(self, env: dict[str, str], model_args: str | None, limit: int):
        self.budget = Budget()
        self.words = Expander(env, self.budget)
        self.sources: list[Source] = []
        self.model_args = model_args
        self.limit = limit
        self.train: TrainCommand | None = None  # the last one met
        self.errors: list[int] = []
        self.depth = 0  # nested `source` files
        self.assumptions: list[str] = []

    # ---- files -------------------------------------------------------------------------------

    def run_file(self, path: str, what: str = "launch script") -> None:
        text = inputs.read_text(path, what, self.limit, OPTION)
        tree = parser().parse(text.encode())
        outer, self.words.file = self.words.file, str(path)
        if tree.root_node.has_error and self.depth == 0:
            self.errors = _error_lines(tree.root_node)
        self.visit(tree.root_node)
        self.words.file = outer

    def _source(self, node, words: list[str]) -> None:
        if len(words) < 2:
            return
        target = words[1]
        here = Path(self.words.file).parent
        candidate = Path(target) if os.path.isabs(target) else here / target
        if "$" not in target and self.depth < MAX_SOURCES and _is_file(candidate):
            self.sources.append(Source(target, line(node), "followed", str(candidate)))
            self._follow(str(candidate), "sourced file")
        elif self.model_args is not None:
            self.sources.append(Source(target, line(node), "followed", self.model_args))
            model_args, self.model_args = self.model_args, None  # stands in for one file only
            self._follow(model_args, "model-args file")
        else:
            self.sources.append(Source(target, line(node), "missing"))

    def _follow(self, path: str, what: str) -> None:
        self.depth += 1
        self.run_file(path, what)
        self.depth -= 1

    # ---- statements --------------------------------------------------------------------------

    def visit(self, node) -> None:
        for child in node.named_children:
            self.statement(child)

    def statement(self, node) -> None:
        if not self.budget.admit(line(node)):
            return
        with self.budget.nested():
            self._statement(node)

    def _statement(self, node) -> None:
        kind = node.type
        if kind == "variable_assignment":
            self.assign(node)
        elif kind in ("variable_assignments", "declaration_command"):
            for child in node.named_children:
                if child.type == "variable_assignment":
                    self.assign(child)
        elif kind == "command":
            self.command(node)
        elif kind == "if_statement":
            self._if(node)
        elif kind in ("function_definition", "comment", "heredoc_body"):
            return
        elif kind in ("test_command", "command_substitution"):
            return
        else:  # if/for/while/case bodies, lists, pipelines, subshells, redirections: in order
            self.visit(node)

    def assign(self, node) -> None:
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if name_node is None or name_node.type != "variable_name":
            return
        name = name_node.text.decode()
        append = any(child.type == "+=" for child in node.children)
        try:
            self.words.vars[name] = self._assigned(name, value, append)
        except Cap as cap:
            self.words.vars[name] = self.words.capped(value if value is not None else node, str(cap))

    def _assigned(self, name: str, value, append: bool) -> str | list[str]:
        """The value `name` holds after `name=value` / `name+=value`."""
        if value is None:
            new: str | list[str] = ""
        elif value.type == "array":
            new = self.words.words(child for child in value.named_children if child.type != "comment")
        else:
            new = self.words.text(value)
        if append:
            old = self.words.vars.get(name, [] if isinstance(new, list) else "")
            if isinstance(old, list):
                new = old + (new if isinstance(new, list) else [new])
            else:
                new = old + (new if isinstance(new, str) else " ".join(new))
        self.budget.charge(new if isinstance(new, list) else [new])
        return new

    def command(self, node) -> None:
        name = node.child_by_field_name("name")
        if name is None:
            return
        try:
            words = self.words.words([name, *node.children_by_field_name("argument")])
        except Cap as cap:
            self.budget.note(line(node), f"a command {cap}: not read")
            return
        if words and words[0] in ("source", "."):
            self._source(node, words)
            return
        found = _train_command(words)
        if found is not None:
            script, argv, launcher = found
            self.train = TrainCommand(script, argv, launcher, line(node))

    # ---- conditions --------------------------------------------------------------------------

    def _if(self, node) -> None:
        """Run the first branch whose condition holds; an undecidable condition is assumed true."""
        condition = node.child_by_field_name("condition")
        skip = ("elif_clause", "else_clause", "comment")
        branches = [
            (condition, [child for child in node.named_children if child != condition and child.type not in skip])
        ]
        for clause in node.named_children:
            named = [child for child in clause.named_children if child.type != "comment"]
            if clause.type == "elif_clause" and named:
                branches.append((named[0], named[1:]))
            elif clause.type == "else_clause":
                branches.append((None, named))
        for test, body in branches:
            holds = True if test is None else self._test(test)
            if holds is None:
                self.assumptions.append(f"line {line(test)}: `{snippet(test)}` is not known statically; assumed true")
                holds = True
            if holds:
                for statement in body:
                    self.statement(statement)
                return

    def _test(self, condition) -> bool | None:
        """Decide `[ -n X ]`, `[ -z X ]`, `[ A op B ]` on known values; None when unknown."""
        if condition.type != "test_command" or condition.named_child_count != 1:
            return None
        expr = condition.named_children[0]
        before = self.words.made
        self.words.empty_unset = True
        try:
            op = expr.child_by_field_name("operator")
            if expr.type == "unary_expression" and op is not None:
                operand = [child for child in expr.named_children if child != op]
                values = [self.words.text(operand[0])] if operand else [""]
            elif expr.type == "binary_expression" and op is not None:
                values = [
                    self.words.text(expr.child_by_field_name("left")),
                    self.words.text(expr.child_by_field_name("right")),
                ]
            else:
                return None
        finally:
            self.words.empty_unset = False
        if self.words.made > before or any("$" in value for value in values):
            return None
        return compare(op.text.decode(), values)


def _error_lines(root) -> list[int]:
    """1-based lines of tree-sitter's error and missing nodes (iterative: trees can be deep)."""
    lines, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            lines.add(line(node))
        stack.extend(child for child in node.children if child.has_error or child.type == "ERROR" or child.is_missing)
    return sorted(lines)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a file to follow
        return False


def _train_command(words: list[str]) -> tuple[str, list[str], list[str]] | None:
    """Find `python[3] [-opts] <script>.py args...` in one command's words."""
    for i, word in enumerate(words):
        if not _PYTHON.match(os.path.basename(word)):
            continue
        j = i + 1
        while j < len(words) and words[j].startswith("-") and words[j] not in ("-m", "-c"):
            j += 1
        if j < len(words) and words[j].endswith(".py"):
            return words[j], words[j + 1 :], words[:i]
    return None
