"""Static reading of slime launch scripts: the argument list that reaches `python3 train.py`.

The script is parsed with tree-sitter-bash and *interpreted*, never executed (real launch scripts run
`pkill -9 python`, `ray stop`, `rm -rf`). Supported: scalar and array assignments (`X=( ... )` with
comments and line continuations, `+=`), `export`/`declare`, `$X` `${X}` `${X[@]}` `${X[i]}`
`${X:-default}`, `$((...))` integer arithmetic, `$(seq a [b] c)`, single/double quotes and word
splitting, `source FILE` / `. FILE`. Every other command substitution stays in the output as its own
text (e.g. `$(nvidia-smi topo -m ...)`), so a placeholder is visible instead of a failure.

The result is the argument list of the *last* `python[3] <script>.py ...` command in the file,
including one behind `ray job submit ... --`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from nanscope.errors import UserError

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")
_DEFAULT_OPS = (":-", "-", ":=", "=", ":+", "+")


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
    kind: str = "command"  # "unset" (a variable never set) | "command" (run-time output) | "other"


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


def _parser():
    import tree_sitter_bash
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """Read a user file; an unreadable one is a UserError naming it."""
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise UserError(f"{path}: cannot read {what}: {e.strerror or e}") from None


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


class _Interpreter:
    """Walks the syntax tree in order, keeping the shell variables.

    Args:
        env: initial variables (the `--env K=V` values).
        model_args: a file to read in place of the first `source` that cannot be found.
    """

    def __init__(self, env: dict[str, str], model_args: str | None):
        self.vars: dict[str, str | list[str]] = dict(env)
        self.unset: dict[str, int] = {}
        self.unset_arrays: list[str] = []
        self.placeholders: list[Placeholder] = []
        self.sources: list[Source] = []
        self.model_args = model_args
        self.train: tuple | None = None  # (script, argv, launcher, line, file)
        self.errors: list[int] = []
        self.file = ""
        self.depth = 0
        self.assumptions: list[str] = []
        self._empty_unset = False  # inside `[ ... ]`: unset variables read as "" (bash semantics)

    # ---- files -------------------------------------------------------------------------------

    def run_file(self, path: str) -> None:
        text = read_text(path, "launch script")
        tree = _parser().parse(text.encode())
        outer, self.file = self.file, str(path)
        if tree.root_node.has_error and self.depth == 0:
            self.errors = sorted({_line(n) for n in _error_nodes(tree.root_node)})
        self.visit(tree.root_node)
        self.file = outer

    def _source(self, node, words: list[str]) -> None:
        if len(words) < 2:
            return
        target = words[1]
        here = Path(self.file).parent
        candidate = Path(target) if os.path.isabs(target) else here / target
        if "$" not in target and candidate.is_file() and self.depth < 8:
            self.sources.append(Source(target, _line(node), "followed", str(candidate)))
            self._follow(str(candidate))
        elif self.model_args is not None:
            self.sources.append(Source(target, _line(node), "followed", self.model_args))
            model_args, self.model_args = self.model_args, None  # stands in for one file only
            self._follow(model_args)
        else:
            self.sources.append(Source(target, _line(node), "missing"))

    def _follow(self, path: str) -> None:
        self.depth += 1
        self.run_file(path)
        self.depth -= 1

    # ---- statements --------------------------------------------------------------------------

    def visit(self, node) -> None:
        for child in node.named_children:
            self.statement(child)

    def statement(self, node) -> None:
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
        if value is None:
            new: str | list[str] = ""
        elif value.type == "array":
            new = [f for c in value.named_children if c.type != "comment" for f in self.fields(c)]
        else:
            new = self.text(value)
        if append:
            old = self.vars.get(name, [] if isinstance(new, list) else "")
            if isinstance(old, list):
                new = old + (new if isinstance(new, list) else [new])
            else:
                new = old + (new if isinstance(new, str) else " ".join(new))
        self.vars[name] = new

    def command(self, node) -> None:
        name = node.child_by_field_name("name")
        if name is None:
            return
        words = self.fields(name)
        for arg in node.children_by_field_name("argument"):
            words += self.fields(arg)
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
            out: list[str] = []
            for c in node.named_children:
                part = self.fields(c)
                if out and part:
                    out[-1] += part[0]
                    out.extend(part[1:])
                else:
                    out.extend(part)
            return out
        return [self._placeholder(node)]

    def text(self, node) -> str:
        """Expand one word as bash does on the right of `=` (no splitting)."""
        t = node.type
        if t in ("simple_expansion", "expansion"):
            return " ".join(self._expand(node))
        if t == "command_substitution":
            return " ".join(self._command_substitution(node))
        if t == "concatenation":
            return "".join(self.text(c) for c in node.named_children)
        return " ".join(self.fields(node))

    def _string_fields(self, node) -> list[str]:
        """Expand "...": one field, except that "${X[@]}" yields one field per element, as in bash."""
        out, pos, src, base = [""], node.start_byte + 1, node.text, node.start_byte
        only_arrays = True
        for c in node.named_children:
            gap = _unescape_dquote(src[pos - base : c.start_byte - base].decode())
            out[-1] += gap
            only_arrays &= not gap
            if c.type == "string_content":
                out[-1] += _unescape_dquote(c.text.decode())
                only_arrays = False
            elif c.type == "expansion" and _index(c) == "@":
                values = self._expand(c)
                if values:
                    out[-1] += values[0]
                    out.extend(values[1:])
            else:
                out[-1] += self.text(c)
                only_arrays = False
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
        word = " ".join(self.text(c) for c in word_nodes)
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
            i = int(index) if index and index.lstrip("-").isdigit() else 0
            return [value[i]] if -len(value) <= i < len(value) else []
        return [value]

    def _command_substitution(self, node) -> list[str]:
        text = node.text.decode()
        if "dirname" in text and ("BASH_SOURCE" in text or "$0" in text):
            # SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)" and friends
            return [str(Path(self.file).resolve().parent)]
        if text.startswith("$((") and text.endswith("))"):
            # tree-sitter-bash reads `${X:-$((A - B))}` as `$( (A - B) )`: re-parse it as arithmetic
            tree = _parser().parse(b"X=" + node.text)
            value = tree.root_node.named_children[0].child_by_field_name("value")
            if value is not None and value.type == "arithmetic_expansion":
                return [self._arithmetic(value)]
        cmd = node.named_children[0] if node.named_child_count == 1 else None
        if cmd is not None and cmd.type == "command":
            name = cmd.child_by_field_name("name")
            words = self.fields(name) if name is not None else []
            for arg in cmd.children_by_field_name("argument"):
                words += self.fields(arg)
            if words and words[0] == "seq" and 2 <= len(words) <= 4:
                try:
                    nums = [int(w) for w in words[1:]]
                except ValueError:
                    return [self._placeholder(node)]
                first, step, last = (1, 1, nums[0]) if len(nums) == 1 else (
                    (nums[0], 1, nums[1]) if len(nums) == 2 else tuple(nums))
                if step == 0:
                    return [self._placeholder(node)]
                return [str(v) for v in range(first, last + (1 if step > 0 else -1), step)]
        return [self._placeholder(node)]

    def _placeholder(self, node, kind: str = "command") -> str:
        text = node.text.decode()
        self.placeholders.append(Placeholder(text, _line(node), self.file, kind))
        return text

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
                self.assumptions.append(f"line {_line(cond)}: `{cond.text.decode()}` is not known statically; "
                                        "assumed true")
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
        before = len(self.placeholders)
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
        if len(self.placeholders) > before or any("$" in v for v in values):
            return None
        return _compare(op.text.decode(), values)

    # ---- arithmetic --------------------------------------------------------------------------

    def _arithmetic(self, node) -> str:
        inner = [c for c in node.named_children]
        try:
            value = 0
            for c in inner:
                value = self._eval(c)
            return str(value)
        except (_Unresolved, ZeroDivisionError):
            return self._placeholder(node)

    def _eval(self, node) -> int:
        t = node.type
        if t == "number":
            return _int(node.text.decode())
        if t in ("variable_name", "word"):
            name = node.text.decode()
            if re.fullmatch(r"-?\d+|0[xX][0-9a-fA-F]+", name):
                return _int(name)
            if name not in self.vars:
                self.unset.setdefault(name, _line(node))
                raise _Unresolved(name)
            return _int_or_raise(self.vars[name])
        if t in ("simple_expansion", "expansion"):
            return _int_or_raise(" ".join(self._expand(node)))
        if t == "parenthesized_expression":
            return self._eval(node.named_children[0])
        if t == "unary_expression":
            op = node.children[0].type
            v = self._eval(node.named_children[0])
            return {"-": -v, "+": v, "!": int(not v), "~": ~v}.get(op, v)
        if t == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            op = node.child_by_field_name("operator").type
            return _binary(op, self._eval(left), self._eval(right))
        if t == "ternary_expression":
            cond, a, b = node.named_children
            return self._eval(a) if self._eval(cond) else self._eval(b)
        raise _Unresolved(t)


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
    ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-gt": int.__gt__, "-ge": int.__ge__, "-lt": int.__lt__,
            "-le": int.__le__}
    if op in ints and re.fullmatch(r"-?\d+", a.strip()) and re.fullmatch(r"-?\d+", b.strip()):
        return ints[op](int(a), int(b))
    return None


def _int(text: str) -> int:
    return int(text, 0) if not re.fullmatch(r"0\d+", text) else int(text, 8)


def _int_or_raise(value) -> int:
    if isinstance(value, list):
        value = value[0] if value else ""
    value = value.strip()
    if not re.fullmatch(r"[-+]?(\d+|0[xX][0-9a-fA-F]+)", value):
        raise _Unresolved(value)
    return _int(value.lstrip("+"))


def _binary(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # bash truncates toward 0
        return q if op == "/" else a - b * q
    table = {
        "+": a + b, "-": a - b, "*": a * b, "<<": a << b if b >= 0 else 0, ">>": a >> b if b >= 0 else 0,
        "&": a & b, "|": a | b, "^": a ^ b, "<": int(a < b), ">": int(a > b), "<=": int(a <= b),
        ">=": int(a >= b), "==": int(a == b), "!=": int(a != b), "&&": int(bool(a and b)),
        "||": int(bool(a or b)),
    }
    if op == "**":
        return a**b if b >= 0 else 0
    if op not in table:
        raise _Unresolved(op)
    return table[op]


def _error_nodes(node):
    if node.type == "ERROR" or node.is_missing:
        yield node
    for c in node.children:
        if c.has_error or c.type == "ERROR" or c.is_missing:
            yield from _error_nodes(c)


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


def parse_script(path: str | os.PathLike, env: dict[str, str] | None = None,
                 model_args: str | None = None) -> LaunchScript:
    """Read a launch script statically and return its train command's arguments.

    Args:
        path: the launch script.
        env: variables the script reads from its environment (`--env TOTAL_NODES=8`).
        model_args: a model-args file to read in place of a `source` that cannot be found.

    Raises:
        UserError: unreadable file, or no `python3 <script>.py` command in it.
    """
    it = _Interpreter(env or {}, model_args)
    if model_args is not None:
        read_text(model_args, "model-args file")  # fail early and clearly
    it.run_file(str(path))
    if it.train is None:
        hint = f" (tree-sitter reported syntax errors at lines {_lines(it.errors)})" if it.errors else ""
        raise UserError(f"{path}: no train command found: expected `python3 <train script>.py ...`, "
                        f"directly or after `ray job submit ... --`{hint}")
    if model_args is not None and it.model_args is not None:
        it.assumptions.append(f"--model-args {model_args}: not used (no `source` in the script was missing)")
    script, argv, launcher, line, _ = it.train
    used = [p for p in it.placeholders if any(p.text in a for a in argv)]
    unique = list({p.text: p for p in used}.values())
    return LaunchScript(str(path), script, argv, launcher, line, it.vars, it.unset, it.unset_arrays, unique,
                        it.sources, it.errors, it.assumptions)


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
