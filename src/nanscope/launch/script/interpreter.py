"""Walking a launch script's syntax tree in order, as bash would run it, without running anything.

Read: scalar and array assignments (`X=( ... )` with comments and line continuations, `+=`), `export`/`declare`,
`source FILE` / `. FILE` (followed, or a `--model-args` file read in its place), `if`/`elif`/`else` on `[ ... ]` tests
of known values (an undecidable test is assumed true, said in `assumptions`), associative and indexed arrays
(`declare -A M=([tp]=2)`, `M[k]=v`: `arrays`), and every command's words, to find the train command. A function is
read where called, with its arguments (`calls`); heredocs and command substitutions are not run (words: `expansion`).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.inputs import MiB
from nanscope.launch.script import arrays
from nanscope.launch.script.arithmetic import compare
from nanscope.launch.script.bounds import (
    MAX_FILES,
    MAX_SOURCES,
    OPTION,
    PARSE_MEMORY,
    PARSE_MEMORY_PER_BYTE,
    PARSE_SECONDS,
    PARSE_SECONDS_PER_MIB,
    Budget,
    Cap,
)
from nanscope.launch.script.calls import Calls, Return
from nanscope.launch.script.commands import called_script, inline_script, train_command
from nanscope.launch.script.continuation import cut_note
from nanscope.launch.script.expansion import Expander, unescape_word
from nanscope.launch.script.markdown import as_pasted
from nanscope.launch.script.syntax import TooSlow, error_lines, line, parse, snippet, without_controls


class NotBash(UserError):
    """tree-sitter-bash gave up on a file past its allowance: not a script nanscope reads."""


@dataclass
class Source:
    """One `source FILE` statement: the path as written and what happened to it."""

    path: str
    line: int
    status: str  # "followed" | "missing"
    followed: str | None = None  # the file read in its place (--model-args)
    reason: str = "not found"  # why a missing one was not read: not found, or what it is (a directory, a FIFO)


@dataclass
class TrainCommand:
    """The training command: its script (or `-m module`, or a CLI such as `megatron sft`), its arguments, the words
    before it (`ray job submit ... --`, `torchrun --nproc_per_node 8`), its line."""

    script: str
    argv: list[str]
    launcher: list[str]
    line: int
    env: dict[str, str] = field(default_factory=dict)  # `NPROC_PER_NODE=8 NNODES=2 megatron sft ...`


# `#SBATCH --nodes=2`, `#SBATCH -N 2`, `#SBATCH --gpus-per-node=8` (`=gpu:8`, `=h100:8`): bounded, linear
_SBATCH = re.compile(
    r"^#SBATCH[ \t]{1,8}(?P<name>--nodes|-N|--gpus-per-node|--ntasks-per-node)[ \t=]{1,4}(?:[a-zA-Z0-9_]{1,20}:)?"
    r"(?P<value>\d{1,6})\b",
    re.MULTILINE,
)
_SBATCH_VARS = {"--nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "-N": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
                "--gpus-per-node": ("SLURM_GPUS_PER_NODE",), "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",)}  # fmt: skip


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
        self.earlier: list[tuple[int, str]] = []  # the train commands met before it: (line, script)
        self.errors: list[int] = []
        self.depth = 0  # nested `source` files
        self.assumptions: list[str] = []
        self.source = b""  # the bytes of the file being read
        self.read_as: list[str] = []  # how a wrapper was read: `bash -c`'s string, #SBATCH's layout
        self.pasted: str | None = None  # the script is a Markdown paste: what of it was read (script.markdown)
        self.cut: str | None = None  # the train command cut by a comment in its continuation (script.continuation)
        self.wrapped: list[str] = []  # scripts it runs that could not be read here (a site wrapper's target)
        self.calls = Calls(self.words, self.budget, self.statement)

    # ---- files -------------------------------------------------------------------------------

    def run_file(self, path: str, what: str = "launch script") -> None:
        self.budget.files += 1
        text, removed = without_controls(inputs.read_text(path, what, self.limit, OPTION))
        if self.depth == 0:  # a report's paste: its quoted command, its values left out as `<name>`
            text, pasted, notes = as_pasted(text)
            self.pasted = f"{path}: {pasted}" if pasted is not None else None
            for at, note in notes:
                self.budget.note(at, note)
        if self.depth == 0 and "#SBATCH" in text:
            self._slurm(text)
        try:
            tree = parse(text.encode(), self.budget)
        except TooSlow as slow:
            raise NotBash(
                f"{path}: {what}: tree-sitter-bash gave up parsing it at line {slow.line}, past its allowance "
                f"({PARSE_SECONDS:g} s of CPU + {PARSE_SECONDS_PER_MIB:g} s per MiB read; {PARSE_MEMORY // MiB} MiB "
                f"+ {PARSE_MEMORY_PER_BYTE} bytes per byte): its error recovery is quadratic on a long malformed run "
                "(`)a)a...`, `a|a|...|`, `x=(x=(...`); not a script nanscope can read"
            ) from None
        outer, self.words.file = self.words.file, str(path)
        outer_source, self.source = self.source, text.encode()
        if removed is not None:
            where = "" if self.depth == 0 else f"{path}: "
            self.budget.note(removed.line, where + removed.note())
        if tree.root_node.has_error and self.depth == 0:
            self.errors = error_lines(tree.root_node)
        try:
            self.visit(tree.root_node)
        finally:
            self.words.file, self.source = outer, outer_source

    def _inline(self, text: str, at: int) -> None:
        """The string a `bash -c` (`srun ... bash -c "..."`) runs, read as the script's own lines at line `at`."""
        before = self.train
        tree = parse(text.encode(), self.budget)
        outer_source, self.source = self.source, text.encode()
        self.depth += 1
        try:
            self.visit(tree.root_node)
        finally:
            self.depth -= 1
            self.source = outer_source
        if self.train is not before and self.train is not None:
            self.train.line = at
            self.read_as.append(f"line {at}: the string its `bash -c` runs read as the launch command")

    def _slurm(self, text: str) -> None:
        """`#SBATCH --nodes=N`, `--gpus-per-node=G` (`--ntasks-per-node`): SLURM_NNODES, SLURM_JOB_NUM_NODES and
        SLURM_GPUS_PER_NODE as Slurm sets them for the job, where neither --env nor the script sets them."""
        for match in _SBATCH.finditer(text):
            name, value = match["name"], match["value"]
            for var in _SBATCH_VARS.get(name, ()):
                if var not in self.words.vars:
                    self.words.vars[var] = value
                    self.read_as.append(f"#SBATCH {name} {value}: {var}={value}, as Slurm sets it for the job")

    def _source(self, node, words: list[str]) -> None:
        if len(words) < 2:
            return
        target = words[1]
        here = Path(self.words.file).parent
        candidate = Path(target) if os.path.isabs(target) else here / target
        if self.budget.files >= MAX_FILES:
            self.sources.append(Source(target, line(node), "missing"))
            self.budget.note(line(node), f"source {target}: not followed: {MAX_FILES} files read already")
        elif "$" not in target and self.depth < MAX_SOURCES and _is_file(candidate):
            self.sources.append(Source(target, line(node), "followed", str(candidate)))
            self._follow(str(candidate), "sourced file")
        elif self.model_args is not None:
            self.sources.append(Source(target, line(node), "followed", self.model_args))
            model_args, self.model_args = self.model_args, None  # stands in for one file only
            self._follow(model_args, "model-args file")
        else:
            self.sources.append(Source(target, line(node), "missing", reason=_not_a_file(candidate)))

    def _wrapper(self, node, words: list[str]) -> None:
        """`bash run.sh a b`: the wrapper script read with its arguments as `$1 $2` (a child shell: the caller's
        variables come back as they were); one not found is noted, with the way to give it."""
        target = words[1]
        candidate = Path(target) if os.path.isabs(target) else Path(self.words.file).parent / target
        if "$" in target or self.depth >= MAX_SOURCES or self.budget.files >= MAX_FILES or not _is_file(candidate):
            self.sources.append(Source(target, line(node), "missing"))
            self.wrapped.append(f"{target} (line {line(node)})")
            self.assumptions.append(
                f"line {line(node)}: {words[0]} {target}: a wrapper script nanscope cannot read here: give it as the "
                "launch script (with its arguments as --env or in a two-line script)"
            )
            return
        self.sources.append(Source(target, line(node), "followed", str(candidate)))
        saved, outer = dict(self.words.vars), self.words.positional
        self.words.positional = words[2:]
        try:
            self._follow(str(candidate), "wrapper script")
        finally:
            self.words.vars.clear()
            self.words.vars.update(saved)
            self.words.positional = outer

    def _follow(self, path: str, what: str) -> None:
        self.depth += 1
        try:
            self.run_file(path, what)
        except Return:  # `return` in a sourced file ends the file
            pass
        finally:
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
        elif kind == "variable_assignments":
            for child in node.named_children:
                if child.type == "variable_assignment":
                    self.assign(child)
        elif kind == "declaration_command":
            self.declare(node)
        elif kind == "command":
            self.command(node)
        elif kind == "if_statement":
            self._if(node)
        elif kind == "function_definition":
            self.calls.define(node)
        elif kind in ("comment", "heredoc_body"):
            return
        elif kind in ("test_command", "command_substitution"):
            return
        else:  # if/for/while/case bodies, lists, pipelines, subshells, redirections: in order
            self.visit(node)

    def declare(self, node) -> None:
        """`declare`/`local`/`typeset`/`export`/`readonly`: `-A` makes an associative array, `-a` an indexed one;
        inside a function `local` (and `declare` without `-g`) keeps the name's old value to restore."""
        keyword = node.children[0].type if node.child_count else ""
        options = "".join(
            child.text.decode()[1:] for child in node.named_children if child.type == "word" and child.text[:1] == b"-"
        )
        in_call = bool(self.calls.frames)
        local = in_call and (keyword == "local" or (keyword in ("declare", "typeset") and "g" not in options))
        for child in node.named_children:
            name_node = child.child_by_field_name("name") if child.type == "variable_assignment" else child
            if name_node is None or name_node.type != "variable_name":
                continue
            name = name_node.text.decode()
            if local:
                self.calls.keep_local(name)
            old = self.words.vars.get(name)
            if "A" in options and not isinstance(old, dict):
                self.words.vars[name] = {}
            elif "a" in options and not isinstance(old, list):
                self.words.vars[name] = [] if old is None else [old] if isinstance(old, str) else list(old.values())
            elif local and child.type == "variable_name":
                self.words.vars[name] = ""  # `local x`: the caller's x is hidden until the call returns
            if child.type == "variable_assignment":
                self.assign(child)

    def assign(self, node) -> None:
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        append = any(child.type == "+=" for child in node.children)
        if name_node is not None and name_node.type == "subscript":
            self._assign_element(name_node, value, append)
            return
        if name_node is None or name_node.type != "variable_name":
            return
        name = name_node.text.decode()
        try:
            self.words.vars[name] = self._assigned(name, value, append)
        except Cap as cap:
            self.words.vars[name] = self.words.capped(value if value is not None else node, str(cap))

    def _assign_element(self, subscript, value, append: bool) -> None:
        """`M[key]=v`, `A[i]=v`, `M[key]+=v`."""
        name = subscript.child_by_field_name("name").text.decode()
        index_node = subscript.child_by_field_name("index")
        try:
            if index_node is None or (value is not None and value.type == "array"):
                raise Cap("not an element bash assigns")
            new = "" if value is None else self.words.text(value)
            self.budget.charge([new])
            self.words.vars[name] = arrays.set_element(
                self.words.vars.get(name), self.words.text(index_node), new, append
            )
        except Cap as cap:
            self.words.vars[name] = self.words.capped(subscript.parent, str(cap))

    def _assigned(self, name: str, value, append: bool) -> arrays.Value:
        """The value `name` holds after `name=value` / `name+=value`."""
        old = self.words.vars.get(name)
        if value is None:
            new: arrays.Value = ""
        elif value.type == "array":
            elements = [child for child in value.named_children if child.type != "comment"]
            if isinstance(old, dict) or any(_keyed(element) is not None for element in elements):
                new = self._keyed_array(elements, old if append else None, isinstance(old, dict))
                self.budget.charge([*new, *new.values()] if isinstance(new, dict) else new)
                return new
            new = self.words.words(elements)
        else:
            new = self.words.text(value)
        if append:
            old = [] if old is None and isinstance(new, list) else "" if old is None else old
            if isinstance(old, dict):
                raise Cap("an associative array appended without a subscript")
            if isinstance(old, list):
                new = old + (new if isinstance(new, list) else [new])
            else:
                new = old + (new if isinstance(new, str) else " ".join(new))
        self.budget.charge(new if isinstance(new, list) else [new])
        return new

    def _keyed_array(self, elements: list, old: arrays.Value | None, associative: bool) -> arrays.Value:
        """`(...)` with `[key]=value` elements: an associative array (or its `key value` pairs), or an indexed
        one set element by element."""
        array: arrays.Value = dict(old) if isinstance(old, dict) else ({} if associative else list(old or []))
        words = []
        for element in elements:
            keyed = _keyed(element)
            if keyed is None:
                words.extend(self.words.words([element]))
                continue
            key_nodes, head, rest = keyed
            key = "".join(self.words.text(node) for node in key_nodes)
            value = head + "".join(self.words.text(node) for node in rest)
            array = arrays.set_element(array, key, value, False)
        if words and not associative:
            raise Cap("an indexed array mixing [i]=value and plain elements")
        if words:  # bash 5.1: `declare -A M=(k1 v1 k2 v2)`
            if len(words) % 2:
                raise Cap("an associative array's key without a value")
            for key, value in zip(words[::2], words[1::2]):
                array = arrays.set_element(array, key, value, False)
        return array

    def command(self, node) -> None:
        name = node.child_by_field_name("name")
        if name is None:
            return
        try:
            words = self.words.words([name, *node.children_by_field_name("argument")], keep_going=True)
        except Cap as cap:
            self.budget.note(line(node), f"a command {cap}: not read")
            return
        if words and words[0] in ("source", "."):
            self._source(node, words)
            return
        called = called_script(words)
        if called is not None:
            self._wrapper(node, called)
            return
        inline = inline_script(words)
        if inline is not None and self.depth < MAX_SOURCES:
            self._inline(inline, line(node))
            return
        if words and words[0] == "return" and (self.calls.frames or self.depth):
            if node.parent is None or node.parent.type not in ("list", "pipeline"):  # `test || return`: unknown
                raise Return
            return
        if words and words[0] == "shift":
            self.calls.shift(words)
            return
        if self.calls.call(words, node):
            return
        found = train_command(words)
        if found is not None:
            script, argv, launcher = found
            self.earlier += [(self.train.line, self.train.script)] if self.train is not None else []
            self.train = TrainCommand(script, argv, launcher, line(node), self._prefix_env(node))
            self.cut = cut_note(self.source, node.end_byte, node.end_point[0] + 1)

    def _prefix_env(self, node) -> dict[str, str]:
        """The `NAME=value` words before a command: its own environment (the script's variables are not changed)."""
        env = {}
        for child in node.named_children:
            if child.type != "variable_assignment":
                continue
            name, value = child.child_by_field_name("name"), child.child_by_field_name("value")
            if name is None or name.type != "variable_name":
                continue
            try:
                assigned = self._assigned(name.text.decode(), value, False)
            except Cap:
                continue
            env[name.text.decode()] = assigned if isinstance(assigned, str) else " ".join(map(str, assigned))
        return env

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


def _keyed(element) -> tuple[list, str, list] | None:
    """An array element `[key]=value` as (the key's nodes, the value's literal start, the value's other nodes);
    None for a plain element. tree-sitter reads `[tp]=2` as a concatenation of `[`, `tp`, `]`, `=2`."""
    if element.type != "concatenation" or element.named_child_count < 3:
        return None
    parts = element.named_children
    if parts[0].type != "word" or parts[0].text != b"[":
        return None
    for i, part in enumerate(parts[1:], 1):
        text = part.text.decode() if part.type == "word" else ""
        if text.startswith("]="):
            return parts[1:i], unescape_word(text[2:]), parts[i + 1 :]
        if text == "]" and i + 1 < len(parts) and parts[i + 1].type == "word" and parts[i + 1].text.startswith(b"="):
            return parts[1:i], unescape_word(parts[i + 1].text.decode()[1:]), parts[i + 2 :]
    return None


def _not_a_file(path: Path) -> str:
    """Why `path` was not read: "not found", or what it is instead of a regular file (never opened: a FIFO would
    block, /dev/zero never end)."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return "not found"
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    what = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"{what}, not a file: not read"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a file to follow
        return False
