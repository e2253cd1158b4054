"""Static reading of slime launch scripts: the argument list that reaches `python3 train.py`.

The script is parsed with tree-sitter-bash and *interpreted*, never executed (real launch scripts run
`pkill -9 python`, `ray stop`, `rm -rf`). Supported: scalar and array assignments (`X=( ... )` with
comments and line continuations, `+=`), `export`/`declare`, `$X` `${X}` `${X[@]}` `${X[i]}`
`${X:-default}`, `$((...))` integer arithmetic, `$(seq a [b] c)`, single/double quotes and word
splitting, `source FILE` / `. FILE`. Every other command substitution stays in the output as its own
text (e.g. `$(nvidia-smi topo -m ...)`), so a placeholder is visible instead of a failure.

Reading is bounded, whatever the script: files are regular and at most `INPUT_LIMIT` bytes; nesting,
value and array sizes, `seq` and the total expansion work are capped (`MAX_*` below); arithmetic is
bash's signed 64-bit, and numbers follow bash's rules (`017` octal, `0x1f`, `base#digits`). A value
that hits a cap, overflows, or that bash would reject (`08`, `65#1`, division by 0) becomes a
placeholder with a note in `LaunchScript.limits`; the rest of the script still reads.

The result is the argument list of the *last* `python[3] <script>.py ...` command in the file,
including one behind `ray job submit ... --`.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from nanscope import inputs
from nanscope.errors import UserError

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")
_DEFAULT_OPS = (":-", "-", ":=", "=", ":+", "+")

INPUT_LIMIT = 4 * inputs.MiB  # bytes of a script, a sourced file, a model-args file
OPTION = "--max-input-mb"  # the doctor option that raises INPUT_LIMIT
MAX_DEPTH = 100  # nested statements, expansions and arithmetic
MAX_VALUE = 1 << 20  # characters of one value: a word, a string, all elements of an array
MAX_ITEMS = 1 << 16  # words of one value (an array, a `seq`, one command)
MAX_WORK = 1 << 26  # characters (plus 64 per word) that all expansions of one script may produce
MAX_STEPS = 1 << 18  # statements, words and arithmetic operations read; then reading stops
MAX_SOURCES = 8  # nested `source` files followed
_WORD_COST = 64  # what one word costs beyond its characters (a Python str)
_SNIPPET = 200  # characters of source text kept in a placeholder or a note
_MAX_NOTES = 20  # limit notes kept; the rest are counted
_MAX_PLACEHOLDERS = 100  # distinct placeholders kept
_INT64 = 1 << 63  # bash arithmetic is signed 64-bit
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"  # bash's base#digits


@dataclass
class Placeholder:
    """A value the script computes at run time that static reading cannot know.

    Attributes:
        text: the source text kept in its place, e.g. `$(nvidia-smi topo -m ...)`.
        line: 1-based line in the file it comes from.
        file: the file it comes from.
    """

    text: str
    line: int
    file: str
    kind: str = "command"  # "unset" (never set) | "command" (run-time output) | "limit" (see limits) | "other"
    reason: str = ""  # for "limit": why static reading gave up on the value


@dataclass
class Source:
    """One `source FILE` statement: the path as written and what happened to it."""

    path: str
    line: int
    status: str  # "followed" | "missing"
    followed: str | None = None  # the file read in its place (--model-args)


@dataclass
class LaunchScript:
    """What a launch script resolves to.

    Attributes:
        path: the script.
        train_script: the python file after `python3`, e.g. `deepresearch/train.py`.
        argv: the resolved arguments after the train script (one string per shell word).
        launcher: the words before `python3` on that command, e.g. `ray job submit ... --`.
        line: 1-based line where the train command starts.
        variables: the shell variables at the end of the script (str or list[str]).
        unset: variables read but never set, name -> first line read.
        unset_arrays: those of `unset` read as arrays (`${X[@]}`), which expand to nothing.
        placeholders: run-time values kept as text.
        sources: the `source` statements met, in order.
        syntax_errors: 1-based lines where tree-sitter reported an error node.
        assumptions: conditions that could not be decided statically, and what was assumed.
        limits: values that hit a reading cap, overflowed or that bash would reject, kept as text.
    """

    path: str
    train_script: str
    argv: list[str]
    launcher: list[str]
    line: int
    variables: dict
    unset: dict[str, int]
    unset_arrays: list[str]
    placeholders: list[Placeholder]
    sources: list[Source]
    syntax_errors: list[int] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)


@cache
def _parser():
    import tree_sitter_bash
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


def _unescape_word(text: str) -> str:
    # Unquoted backslash escapes: `\x` -> `x`, `\<newline>` -> nothing.
    return re.sub(r"\\(\n|.)", lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def _unescape_dquote(text: str) -> str:
    # Inside "...", a backslash only escapes $ ` " \ and newline.
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def _line(node) -> int:
    return node.start_point[0] + 1


class _Unresolved(Exception):
    """An arithmetic operand that is not a known integer."""


class _Cap(Exception):
    """A value static reading gives up on: a cap was hit, or bash itself would reject it (the reason)."""


def _snippet(node) -> str:
    """The node's source text, cut to _SNIPPET characters."""
    if node.end_byte - node.start_byte <= _SNIPPET:
        return node.text.decode(errors="replace")
    return node.text[:_SNIPPET].decode(errors="replace") + "..."


def _joined(parts: Iterable[str], sep: str = "") -> str:
    """`sep.join(parts)`, stopping (a _Cap) as soon as it grows past MAX_VALUE."""
    out, size = [], -len(sep)
    for part in parts:
        size += len(sep) + len(part)
        if size > MAX_VALUE:
            raise _Cap(_too_long())
        out.append(part)
    return sep.join(out)


def _too_long() -> str:
    return f"longer than {MAX_VALUE:,} characters or {MAX_ITEMS:,} words"


class _Interpreter:
    """Walks the syntax tree in order, keeping the shell variables.

    Args:
        env: initial variables (the `--env K=V` values).
        model_args: a file to read in place of the first `source` that cannot be found.
        limit: the most bytes of one file read.
    """

    def __init__(self, env: dict[str, str], model_args: str | None, limit: int):
        self.vars: dict[str, str | list[str]] = dict(env)
        self.unset: dict[str, int] = {}
        self.unset_arrays: list[str] = []
        self.placeholders: dict[str, Placeholder] = {}  # by text, the latest of each; at most _MAX_PLACEHOLDERS
        self.made = 0  # placeholders made, kept or not
        self.sources: list[Source] = []
        self.model_args = model_args
        self.limit = limit
        self.train: tuple | None = None  # (script, argv, launcher, line, file)
        self.errors: list[int] = []
        self.file = ""
        self.depth = 0  # nested `source` files
        self.level = 0  # nested statements, words and arithmetic
        self.work = 0  # characters produced so far (MAX_WORK)
        self.steps = 0  # statements, words and operations read so far (MAX_STEPS)
        self.stopped: int | None = None  # the line where MAX_STEPS stopped reading
        self.assumptions: list[str] = []
        self.limits: list[str] = []
        self.dropped = 0  # limit notes past _MAX_NOTES
        self._empty_unset = False  # inside `[ ... ]`: unset variables read as "" (bash semantics)

    # ---- files -------------------------------------------------------------------------------

    def run_file(self, path: str, what: str = "launch script") -> None:
        text = inputs.read_text(path, what, self.limit, OPTION)
        tree = _parser().parse(text.encode())
        outer, self.file = self.file, str(path)
        if tree.root_node.has_error and self.depth == 0:
            self.errors = _error_lines(tree.root_node)
        self.visit(tree.root_node)
        self.file = outer

    def _source(self, node, words: list[str]) -> None:
        if len(words) < 2:
            return
        target = words[1]
        here = Path(self.file).parent
        candidate = Path(target) if os.path.isabs(target) else here / target
        if "$" not in target and self.depth < MAX_SOURCES and _is_file(candidate):
            self.sources.append(Source(target, _line(node), "followed", str(candidate)))
            self._follow(str(candidate), "sourced file")
        elif self.model_args is not None:
            self.sources.append(Source(target, _line(node), "followed", self.model_args))
            model_args, self.model_args = self.model_args, None  # stands in for one file only
            self._follow(model_args, "model-args file")
        else:
            self.sources.append(Source(target, _line(node), "missing"))

    def _follow(self, path: str, what: str) -> None:
        self.depth += 1
        self.run_file(path, what)
        self.depth -= 1

    # ---- statements --------------------------------------------------------------------------

    def visit(self, node) -> None:
        for child in node.named_children:
            self.statement(child)

    def statement(self, node) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            if self.stopped is None:
                self.stopped = _line(node)
                self._note(node, f"more than {MAX_STEPS:,} statements, words and operations: the rest is not read")
            return
        if self.level >= MAX_DEPTH:
            self._note(node, f"statements nested more than {MAX_DEPTH} deep: not read")
            return
        self.level += 1
        try:
            self._statement(node)
        finally:
            self.level -= 1

    def _statement(self, node) -> None:
        t = node.type
        if t == "variable_assignment":
            self.assign(node)
        elif t in ("variable_assignments", "declaration_command"):
            for c in node.named_children:
                if c.type == "variable_assignment":
                    self.assign(c)
        elif t == "command":
            self.command(node)
        elif t == "if_statement":
            self._if(node)
        elif t in ("function_definition", "comment", "heredoc_body"):
            return
        elif t in ("test_command", "command_substitution"):
            return
        else:  # if/for/while/case bodies, lists, pipelines, subshells, redirections: in order
            self.visit(node)

    def assign(self, node) -> None:
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if name_node is None or name_node.type != "variable_name":
            return
        name = name_node.text.decode()
        append = any(c.type == "+=" for c in node.children)
        try:
            self.vars[name] = self._assigned(name, value, append)
        except _Cap as e:
            self.vars[name] = self._capped(value if value is not None else node, str(e))

    def _assigned(self, name: str, value, append: bool) -> str | list[str]:
        """The value `name` holds after `name=value` / `name+=value`."""
        if value is None:
            new: str | list[str] = ""
        elif value.type == "array":
            new = self._words(c for c in value.named_children if c.type != "comment")
        else:
            new = self.text(value)
        if append:
            old = self.vars.get(name, [] if isinstance(new, list) else "")
            if isinstance(old, list):
                new = old + (new if isinstance(new, list) else [new])
            else:
                new = old + (new if isinstance(new, str) else " ".join(new))
        self._charge(new if isinstance(new, list) else [new])
        return new

    def command(self, node) -> None:
        name = node.child_by_field_name("name")
        if name is None:
            return
        try:
            words = self._words([name, *node.children_by_field_name("argument")])
        except _Cap as e:
            self._note(node, f"a command {e}: not read")
            return
        if words and words[0] in ("source", "."):
            self._source(node, words)
            return
        found = _train_command(words)
        if found is not None:
            script, argv, launcher = found
            self.train = (script, argv, launcher, _line(node), self.file)

    # ---- words -------------------------------------------------------------------------------

    def fields(self, node) -> list[str]:
        """Expand one unquoted shell word to fields (word splitting applies to expansions)."""
        try:
            with self._deeper():
                out = self._fields(node)
            self._charge(out)
            return out
        except _Cap as e:
            return [self._capped(node, str(e))]

    def text(self, node) -> str:
        """Expand one word as bash does on the right of `=` (no splitting)."""
        try:
            with self._deeper():
                out = self._text(node)
            self._charge([out])
            return out
        except _Cap as e:
            return self._capped(node, str(e))

    def _words(self, nodes: Iterable) -> list[str]:
        """The fields of several words, one list (a _Cap past MAX_ITEMS words or MAX_VALUE characters)."""
        out: list[str] = []
        size = 0
        for node in nodes:
            part = self.fields(node)
            size += sum(len(w) + 1 for w in part)
            out += part
            if size > MAX_VALUE or len(out) > MAX_ITEMS:
                raise _Cap(_too_long())
        return out

    def _fields(self, node) -> list[str]:
        t = node.type
        if t in ("word", "number", "command_name"):
            if t == "command_name" and node.named_child_count:
                return self.fields(node.named_children[0])
            return [_unescape_word(node.text.decode())]
        if t == "raw_string":
            return [node.text.decode()[1:-1]]
        if t == "ansi_c_string":
            return [node.text.decode()[2:-1]]
        if t in ("string", "translated_string"):
            return self._string_fields(node)
        if t in ("simple_expansion", "expansion"):
            return [w for v in self._expand(node) for w in v.split()]
        if t == "command_substitution":
            return self._command_substitution(node)
        if t == "arithmetic_expansion":
            return [self._arithmetic(node)]
        if t == "concatenation":
            return self._concatenation(node)
        return [self._placeholder(node)]

    def _concatenation(self, node) -> list[str]:
        """Adjacent parts glue: the last field of one to the first of the next."""
        out: list[str] = []
        size = 0
        for c in node.named_children:
            part = self.fields(c)
            size += sum(len(w) for w in part)
            if out and part:
                out[-1] += part[0]
                out.extend(part[1:])
            else:
                out.extend(part)
            if size > MAX_VALUE or len(out) > MAX_ITEMS:
                raise _Cap(_too_long())
        return out

    def _text(self, node) -> str:
        t = node.type
        if t in ("simple_expansion", "expansion"):
            return _joined(self._expand(node), " ")
        if t == "command_substitution":
            return _joined(self._command_substitution(node), " ")
        if t == "concatenation":
            return _joined(self.text(c) for c in node.named_children)
        return _joined(self.fields(node), " ")

    def _string_fields(self, node) -> list[str]:
        """Expand "...": one field, except that "${X[@]}" yields one field per element, as in bash."""
        out, pos, src, base = [""], node.start_byte + 1, node.text, node.start_byte
        only_arrays = True
        size = 0  # characters in `out`
        for c in node.named_children:
            gap = _unescape_dquote(src[pos - base : c.start_byte - base].decode())
            only_arrays &= not gap
            if c.type == "string_content":
                values = [gap + _unescape_dquote(c.text.decode())]
                only_arrays = False
            elif c.type == "expansion" and _index(c) == "@":
                values = self._expand(c) or [""]
                values[0] = gap + values[0]
            else:
                values = [gap + self.text(c)]
                only_arrays = False
            out[-1] += values[0]
            out.extend(values[1:])
            size += sum(len(v) for v in values)
            if size > MAX_VALUE or len(out) > MAX_ITEMS:
                raise _Cap(_too_long())
            pos = c.end_byte
        tail = _unescape_dquote(src[pos - base : node.end_byte - 1 - base].decode())
        out[-1] += tail
        if only_arrays and not tail and out == [""] and node.named_child_count:
            return []  # "${EMPTY[@]}" is zero words
        return out

    def _expand(self, node) -> list[str]:
        """`$X`, `${X}`, `${X[@]}`, `${X[i]}`, `${X:-d}`, `${#X[@]}`: the values (a list)."""
        ref = self._reference(node)
        if isinstance(ref, list):
            return ref
        name, index = ref
        anon = [c.type for c in node.children if not c.is_named]
        if set(anon) - {"$", "${", "}", "#", *_DEFAULT_OPS}:  # ${X%...}, ${X/a/b}, ...: not modelled
            return [self._placeholder(node)]
        value = self.vars.get(name)
        op = next((o for o in anon if o in _DEFAULT_OPS), None)
        if op is not None:
            replaced = self._operator(name, value, op, node.named_children[1:])
            if replaced is not None:
                return replaced
        elif name not in self.vars and not self._empty_unset:
            self.unset.setdefault(name, _line(node))
        if "#" in anon and node.children[1].type == "#":  # ${#X[@]} / ${#X}
            return [str(len(value) if isinstance(value, list) else len(value or ""))]
        return self._lookup(node, name, index, value)

    def _reference(self, node) -> tuple[str, str | None] | list[str]:
        """(name, subscript) of an expansion, or its final value for special/positional ones."""
        head = node.named_children[0] if node.named_child_count else None
        if head is not None and head.type == "subscript":
            idx = head.child_by_field_name("index")
            name = head.child_by_field_name("name").text.decode()
            index = self.text(idx) if idx is not None else None
        elif head is not None and head.type == "variable_name":
            name, index = head.text.decode(), None
        else:  # $@, $$ ...: run-time values
            return [self._placeholder(node, "other")]
        if name in ("0", "BASH_SOURCE"):
            return [self.file]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):  # $1, ${2}: positional, unknown
            return [self._placeholder(node, "other")]
        return name, index

    def _operator(self, name: str, value, op: str, word_nodes) -> list[str] | None:
        """`:-`, `-`, `:=`, `=`, `:+`, `+`: the replacement, or None to use the value."""
        empty = value is None or value == "" or value == []
        missing = empty if op.startswith(":") else value is None
        word = _joined((self.text(c) for c in word_nodes), " ")
        if op.endswith("+"):  # alternate value: only when set
            return [] if missing else [word]
        if not missing:
            return None
        if op.endswith("="):
            self.vars[name] = word
        return [word]

    def _lookup(self, node, name: str, index: str | None, value) -> list[str]:
        if value is None:
            if self._empty_unset:
                return [""]
            if index in ("@", "*"):  # unset array: expands to nothing, as in bash (recorded)
                if name not in self.unset_arrays:
                    self.unset_arrays.append(name)
                return []
            return [self._placeholder(node, "unset")]
        if isinstance(value, list):
            if index in ("@", "*"):
                return list(value)
            i = int(index) if index and re.fullmatch(r"-?[0-9]{1,18}", index) else 0
            return [value[i]] if -len(value) <= i < len(value) else []
        return [value]

    def _command_substitution(self, node) -> list[str]:
        small = node.end_byte - node.start_byte <= _SNIPPET
        text = node.text.decode(errors="replace") if small else ""
        if "dirname" in text and ("BASH_SOURCE" in text or "$0" in text):
            # SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)" and friends
            return [str(Path(self.file).resolve().parent)]
        if node.text.startswith(b"$((") and node.text.endswith(b"))"):
            # tree-sitter-bash reads `${X:-$((A - B))}` as `$( (A - B) )`: re-parse it as arithmetic
            self._charge([node.text])  # the re-parse is work too
            tree = _parser().parse(b"X=" + node.text)
            value = tree.root_node.named_children[0].child_by_field_name("value")
            if value is not None and value.type == "arithmetic_expansion":
                return [self._arithmetic(value)]
        cmd = node.named_children[0] if node.named_child_count == 1 else None
        if cmd is not None and cmd.type == "command":
            name = cmd.child_by_field_name("name")
            words = self._words([name, *cmd.children_by_field_name("argument")]) if name is not None else []
            if words and words[0] == "seq" and 2 <= len(words) <= 4:
                return self._seq(node, words[1:])
        return [self._placeholder(node)]

    def _seq(self, node, words: list[str]) -> list[str]:
        """`seq LAST`, `seq FIRST LAST`, `seq FIRST STEP LAST` on integers."""
        if not all(re.fullmatch(r"-?[0-9]{1,18}", w) for w in words):
            return [self._placeholder(node)]
        nums = [int(w) for w in words]
        first, step, last = (
            (1, 1, nums[0]) if len(nums) == 1 else ((nums[0], 1, nums[1]) if len(nums) == 2 else tuple(nums))
        )
        if step == 0:
            return [self._placeholder(node)]
        values = range(first, last + (1 if step > 0 else -1), step)
        if len(values) > MAX_ITEMS:
            raise _Cap(f"`seq` gives {len(values):,} numbers, more than {MAX_ITEMS:,}")
        return [str(v) for v in values]

    def _placeholder(self, node, kind: str = "command", reason: str = "") -> str:
        text = _snippet(node)
        self.made += 1
        if text in self.placeholders or len(self.placeholders) < _MAX_PLACEHOLDERS:
            self.placeholders[text] = Placeholder(text, _line(node), self.file, kind, reason)
        return text

    # ---- bounds ------------------------------------------------------------------------------

    @contextmanager
    def _deeper(self):
        """One level of nesting more (a _Cap past MAX_DEPTH, or once MAX_WORK or MAX_STEPS is spent)."""
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Cap(f"more than {MAX_STEPS:,} statements, words and operations")
        if self.level >= MAX_DEPTH:
            raise _Cap(f"nested more than {MAX_DEPTH} deep")
        if self.work > MAX_WORK:
            raise _Cap(f"the script expands to more than {MAX_WORK >> 20} Mi characters in all")
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def _charge(self, values: list) -> None:
        """Count what an expansion produced against MAX_VALUE, MAX_ITEMS and MAX_WORK."""
        size = sum(len(v) for v in values)
        self.work += size + _WORD_COST * len(values)
        if size > MAX_VALUE or len(values) > MAX_ITEMS:
            raise _Cap(_too_long())
        if self.work > MAX_WORK:
            raise _Cap(f"the script expands to more than {MAX_WORK >> 20} Mi characters in all")

    def _capped(self, node, reason: str) -> str:
        """A placeholder for a value static reading gave up on, with its note."""
        text = self._placeholder(node, "limit", reason)
        self._note(node, f"`{text}`: {reason}; kept as text")
        return text

    def _note(self, node, text: str) -> None:
        if len(self.limits) < _MAX_NOTES:
            self.limits.append(f"line {_line(node)}: {text}")
        else:
            self.dropped += 1

    # ---- conditions --------------------------------------------------------------------------

    def _if(self, node) -> None:
        """Run the first branch whose condition holds; an undecidable condition is assumed true."""
        cond = node.child_by_field_name("condition")
        skip = ("elif_clause", "else_clause", "comment")
        branches = [(cond, [c for c in node.named_children if c != cond and c.type not in skip])]
        for c in node.named_children:
            named = [x for x in c.named_children if x.type != "comment"]
            if c.type == "elif_clause" and named:
                branches.append((named[0], named[1:]))
            elif c.type == "else_clause":
                branches.append((None, named))
        for cond, body in branches:
            holds = True if cond is None else self._test(cond)
            if holds is None:
                self.assumptions.append(f"line {_line(cond)}: `{_snippet(cond)}` is not known statically; assumed true")
                holds = True
            if holds:
                for st in body:
                    self.statement(st)
                return

    def _test(self, cond) -> bool | None:
        """Decide `[ -n X ]`, `[ -z X ]`, `[ A op B ]` on known values; None when unknown."""
        if cond.type != "test_command" or cond.named_child_count != 1:
            return None
        expr = cond.named_children[0]
        before = self.made
        self._empty_unset = True
        try:
            op = expr.child_by_field_name("operator")
            if expr.type == "unary_expression" and op is not None:
                operand = [c for c in expr.named_children if c != op]
                values = [self.text(operand[0])] if operand else [""]
            elif expr.type == "binary_expression" and op is not None:
                values = [self.text(expr.child_by_field_name("left")), self.text(expr.child_by_field_name("right"))]
            else:
                return None
        finally:
            self._empty_unset = False
        if self.made > before or any("$" in v for v in values):
            return None
        return _compare(op.text.decode(), values)

    # ---- arithmetic --------------------------------------------------------------------------

    def _arithmetic(self, node) -> str:
        """`$(( ... ))`: the value, or the text kept when an operand is not known."""
        try:
            value = 0
            for c in node.named_children:
                value = self._eval(c)
            return str(value)
        except _Unresolved:
            return self._placeholder(node)

    def _eval(self, node) -> int:
        with self._deeper():
            return _int64(self._evaluate(node))

    def _evaluate(self, node) -> int:
        t = node.type
        if t == "number":
            return _bash_int(node.text.decode())
        if t in ("variable_name", "word"):
            name = node.text.decode()
            if re.fullmatch(r"-?[0-9][0-9A-Za-z@_#]*", name):
                return -_bash_int(name[1:]) if name.startswith("-") else _bash_int(name)
            if name not in self.vars:
                self.unset.setdefault(name, _line(node))
                raise _Unresolved(name)
            return _int_or_raise(self.vars[name])
        if t in ("simple_expansion", "expansion"):
            return _int_or_raise(" ".join(self._expand(node)))
        if t == "parenthesized_expression":
            return self._eval(node.named_children[0])
        if t == "unary_expression":
            return self._unary([node.children[0].type], node.named_children[0])
        if t == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            op = node.child_by_field_name("operator").type
            return _binary(op, self._eval(left), self._eval(right))
        if t == "ternary_expression":
            cond, a, b = node.named_children
            return self._eval(a) if self._eval(cond) else self._eval(b)
        raise _Unresolved(t)

    def _unary(self, ops: list[str], node) -> int:
        """`-x`, `+x`, `!x`, `~x`: bash binds them tighter than any binary operator, tree-sitter-bash looser
        (`-7 - 1` is read as -(7 - 1)), so the operators (`ops`, outermost first) go down to the leftmost operand."""
        with self._deeper():
            if node.type == "unary_expression":
                return self._unary([*ops, node.children[0].type], node.named_children[0])
            if node.type == "binary_expression":
                left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
                operator = node.child_by_field_name("operator").type
                return _int64(_binary(operator, self._unary(ops, left), self._eval(right)))
            if node.type == "ternary_expression":
                cond, a, b = node.named_children
                return self._eval(a) if self._unary(ops, cond) else self._eval(b)
            v = self._eval(node)
            for op in reversed(ops):
                v = _int64({"-": -v, "+": v, "!": int(not v), "~": ~v}.get(op, v))
            return v


def _index(node) -> str | None:
    """The subscript of `${X[i]}` as written (`@`, `*`, `0`), else None."""
    head = node.named_children[0] if node.named_child_count else None
    if head is None or head.type != "subscript":
        return None
    idx = head.child_by_field_name("index")
    return idx.text.decode() if idx is not None else None


def _compare(op: str, values: list[str]) -> bool | None:
    if op == "-n" and len(values) == 1:
        return bool(values[0])
    if op == "-z" and len(values) == 1:
        return not values[0]
    if len(values) != 2:
        return None
    a, b = values
    if op in ("=", "=="):
        return a == b
    if op == "!=":
        return a != b
    ints = {
        "-eq": int.__eq__,
        "-ne": int.__ne__,
        "-gt": int.__gt__,
        "-ge": int.__ge__,
        "-lt": int.__lt__,
        "-le": int.__le__,
    }
    if op in ints and re.fullmatch(r"-?[0-9]{1,18}", a.strip()) and re.fullmatch(r"-?[0-9]{1,18}", b.strip()):
        return ints[op](int(a), int(b))
    return None


def _bash_int(text: str) -> int:
    """An integer constant as bash reads it: `017` octal, `0x1f` hex, `base#digits` (base 2..64), else decimal.

    Raises:
        _Cap: what bash rejects (`08`, `65#1`, `2#`), or a value past its signed 64 bits.
    """
    head, sep, digits = text.partition("#")
    if sep:
        base = int(head) if re.fullmatch(r"[0-9]{1,2}", head) else 0
        if not 2 <= base <= 64:
            raise _Cap(f"{text}: invalid arithmetic base")
    elif re.match(r"0[xX]", text):
        base, digits = 16, text[2:] or "0"  # bash reads a bare `0x` as 0
    elif text.startswith("0"):
        base, digits = 8, text
    else:
        base, digits = 10, text
    if not digits:
        raise _Cap(f"{text}: invalid integer constant")
    value = 0
    for ch in digits:
        d = _DIGITS.find(ch.lower() if base <= 36 else ch)  # up to base 36 letters are case-insensitive
        if not 0 <= d < base:
            raise _Cap(f"{text}: value too great for base")
        value = _int64(value * base + d)
    return value


def _int64(value: int) -> int:
    if not -_INT64 <= value < _INT64:
        raise _Cap("overflows bash's signed 64-bit arithmetic")
    return value


def _int_or_raise(value) -> int:
    if isinstance(value, list):
        value = value[0] if value else ""
    m = re.fullmatch(r"([-+]?)([0-9][0-9A-Za-z@_#]*)", value.strip())
    if m is None:
        raise _Unresolved(value)
    number = _bash_int(m[2])
    return -number if m[1] == "-" else number


_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "&&": lambda a, b: bool(a and b),
    "||": lambda a, b: bool(a or b),
}


def _binary(op: str, a: int, b: int) -> int:
    """One bash arithmetic operator on 64-bit operands (a _Cap where bash stops, or on overflow)."""
    if op in ("/", "%"):
        if b == 0:
            raise _Cap("division by 0")
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # bash truncates toward 0
        return q if op == "/" else a - b * q
    if op == "**":
        if b < 0:
            raise _Cap("exponent less than 0")
        if abs(a) > 1 and b >= 64:  # |a|**64 >= 2**64: checked before it is computed
            raise _Cap("overflows bash's signed 64-bit arithmetic")
        return a**b
    if op in ("<<", ">>"):
        if not 0 <= b < 64:  # bash shifts by the count modulo 64 on x86: machine-dependent
            raise _Cap(f"shift count {b} is outside 0..63")
        return a << b if op == "<<" else a >> b
    if op not in _OPS:
        raise _Unresolved(op)
    return int(_OPS[op](a, b))


def _error_lines(root) -> list[int]:
    """1-based lines of tree-sitter's error and missing nodes (iterative: trees can be deep)."""
    lines, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            lines.add(_line(node))
        stack.extend(c for c in node.children if c.has_error or c.type == "ERROR" or c.is_missing)
    return sorted(lines)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a file to follow
        return False


def _train_command(words: list[str]) -> tuple[str, list[str], list[str]] | None:
    """Find `python[3] [-opts] <script>.py args...` in one command's words."""
    for i, w in enumerate(words):
        if not _PYTHON.match(os.path.basename(w)):
            continue
        j = i + 1
        while j < len(words) and words[j].startswith("-") and words[j] not in ("-m", "-c"):
            j += 1
        if j < len(words) and words[j].endswith(".py"):
            return words[j], words[j + 1 :], words[:i]
    return None


def parse_script(
    path: str | os.PathLike, env: dict[str, str] | None = None, model_args: str | None = None, limit: int = INPUT_LIMIT
) -> LaunchScript:
    """Read a launch script statically and return its train command's arguments.

    Args:
        path: the launch script.
        env: variables the script reads from its environment (`--env TOTAL_NODES=8`).
        model_args: a model-args file to read in place of a `source` that cannot be found.
        limit: the most bytes read from one file (the script, a sourced file, the model-args file).

    Raises:
        UserError: a file that is missing, not a regular file or over `limit`, or no
            `python3 <script>.py` command in the script.
    """
    it = _Interpreter(env or {}, model_args, limit)
    if model_args is not None:
        inputs.check_file(model_args, "model-args file", limit, OPTION)  # fail early and clearly
    it.run_file(str(path))
    if it.train is None:
        hint = f" (tree-sitter reported syntax errors at lines {_lines(it.errors)})" if it.errors else ""
        if it.stopped is not None:
            hint += f" (reading stopped at line {it.stopped}: more than {MAX_STEPS:,} statements, words and operations)"
        raise UserError(
            f"{path}: no train command found: expected `python3 <train script>.py ...`, "
            f"directly or after `ray job submit ... --`{hint}"
        )
    if model_args is not None and it.model_args is not None:
        it.assumptions.append(f"--model-args {model_args}: not used (no `source` in the script was missing)")
    script, argv, launcher, line, _ = it.train
    words = " ".join(argv)  # a placeholder with spaces may have been split into several words
    used = [p for p in it.placeholders.values() if p.text in words]
    limits = it.limits + ([f"{it.dropped} more value(s) kept as text at a reading limit"] if it.dropped else [])
    return LaunchScript(
        str(path),
        script,
        argv,
        launcher,
        line,
        it.vars,
        it.unset,
        it.unset_arrays,
        used,
        it.sources,
        it.errors,
        it.assumptions,
        limits,
    )


def _lines(lines: list[int]) -> str:
    return ", ".join(map(str, lines[:5])) + (" ..." if len(lines) > 5 else "")


def parse_env(items: list[str] | None) -> dict[str, str]:
    """`["K=V", ...]` -> dict; a malformed item is a UserError."""
    env = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UserError(f"--env {item!r}: expected NAME=VALUE")
        env[key] = value
    return env
