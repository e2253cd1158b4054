"""Expanding shell words as bash does, with the variables a launch script has set so far.

Supported: `$X` `${X}` `${X[@]}` `${X[i]}` `${#X[@]}`, `${X:-default}` and the other default
operators, `$((...))` integer arithmetic (`arithmetic`), `$(seq a [b] c)`, single/double quotes
and word splitting. Every other command substitution, and every value static reading cannot know
(an unset variable, `$1`, `${X%...}`), stays in the output as its own text: a `Placeholder`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nanscope.launch.script import arrays
from nanscope.launch.script.arithmetic import Evaluator, Unresolved, int_or_raise
from nanscope.launch.script.bounds import MAX_ITEMS, MAX_PLACEHOLDERS, MAX_VALUE, SNIPPET, Budget, Cap, joined, too_long
from nanscope.launch.script.syntax import TooSlow, line, parse, snippet

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
    kind: str = "command"  # "unset" (never set) | "command" (run-time output) | "limit" (see limits) | "other"
    reason: str = ""  # for "limit": why static reading gave up on the value


def unescape_word(text: str) -> str:
    # Unquoted backslash escapes: `\x` -> `x`, `\<newline>` -> nothing.
    return re.sub(r"\\(\n|.)", lambda match: "" if match.group(1) == "\n" else match.group(1), text)


def _unescape_dquote(text: str) -> str:
    # Inside "...", a backslash only escapes $ ` " \ and newline.
    return re.sub(r'\\([$`"\\\n])', lambda match: "" if match.group(1) == "\n" else match.group(1), text)


def _index(node) -> str | None:
    """The subscript of `${X[i]}` as written (`@`, `*`, `0`), else None."""
    head = node.named_children[0] if node.named_child_count else None
    if head is None or head.type != "subscript":
        return None
    index = head.child_by_field_name("index")
    return index.text.decode() if index is not None else None


def _splits_in_quotes(node) -> bool:
    """`"${X[@]}"`, `"$@"`, `"${@}"`: one field per element, even inside double quotes."""
    if node.type == "expansion" and _index(node) == "@":
        return True
    head = node.named_children[0] if node.type in ("simple_expansion", "expansion") and node.named_child_count else None
    return (
        head is not None and head.type == "special_variable_name" and head.text == b"@" and node.named_child_count == 1
    )


class _Glue:
    """Fields built from parts, the first field of each part glued to the last field so far.

    The last field's pieces are joined once, when it is closed: gluing stays linear in the characters
    (`str +=` on a list element copies the whole field each time). A Cap past MAX_VALUE or MAX_ITEMS.
    """

    def __init__(self, start: str | None):
        self.closed: list[str] = []
        self.last: list[str] | None = None if start is None else [start]  # the open field's pieces
        self.size = 0

    def add(self, part: list[str]) -> None:
        if not part:
            return
        if self.last is None:
            self.last = [part[0]]
        else:
            self.last.append(part[0])
        for field in part[1:]:
            self.closed.append("".join(self.last))
            self.last = [field]
        self.size += sum(len(field) for field in part)
        if self.size > MAX_VALUE or len(self.closed) >= MAX_ITEMS:
            raise Cap(too_long())

    def fields(self) -> list[str]:
        return self.closed + ([] if self.last is None else ["".join(self.last)])


class Expander:
    """The shell variables, and the expansion of words with them.

    Args:
        env: initial variables (the `--env K=V` values).
        budget: the reading's bounds, charged for every word expanded.

    Attributes:
        vars: the shell variables (str or list[str]).
        unset: variables read but never set, name -> first line read.
        unset_arrays: those of `unset` read as arrays (`${X[@]}`), which expand to nothing.
        placeholders: by text, the latest of each; at most MAX_PLACEHOLDERS.
        made: placeholders made, kept or not.
        file: the file being read ($0, ${BASH_SOURCE}, and where placeholders come from).
        empty_unset: inside `[ ... ]`: unset variables read as "" (bash semantics).
        positional: the arguments of the function call being read (`$1`, `"$@"`, `$#`); None outside one.
    """

    def __init__(self, env: dict[str, str], budget: Budget):
        self.vars: dict[str, str | list[str]] = dict(env)
        self.unset: dict[str, int] = {}
        self.unset_arrays: list[str] = []
        self.placeholders: dict[str, Placeholder] = {}
        self.made = 0
        self.file = ""
        self.empty_unset = False
        self.budget = budget
        self.positional: list[str] | None = None  # $1 ... inside a function the script calls; None: unknown

    # ---- words -------------------------------------------------------------------------------

    def fields(self, node) -> list[str]:
        """Expand one unquoted shell word to fields (word splitting applies to expansions)."""
        try:
            with self.budget.deeper():
                out = self._fields(node)
            self.budget.charge(out)
            return out
        except Cap as cap:
            return [self.capped(node, str(cap))]

    def text(self, node) -> str:
        """Expand one word as bash does on the right of `=` (no splitting)."""
        try:
            with self.budget.deeper():
                out = self._text(node)
            self.budget.charge([out])
            return out
        except Cap as cap:
            return self.capped(node, str(cap))

    def words(self, nodes: Iterable, *, keep_going: bool = False) -> list[str]:
        """The fields of several words, one list (a Cap past MAX_ITEMS words or MAX_VALUE characters).

        keep_going: a word whose fields would take the list past a cap is kept as text instead (a command's
            arguments: the command is still read, its other words as they are).
        """
        out: list[str] = []
        size = 0
        for node in nodes:
            part = self.fields(node)
            grown = size + sum(len(word) + 1 for word in part)
            if keep_going and (grown > MAX_VALUE or len(out) + len(part) > MAX_ITEMS):
                part = [self.capped(node, too_long())]
                grown = size + len(part[0]) + 1
            size = grown
            out += part
            if size > MAX_VALUE or len(out) > MAX_ITEMS:
                raise Cap(too_long())
        return out

    def _fields(self, node) -> list[str]:
        kind = node.type
        if kind in ("word", "number", "command_name"):
            if kind == "command_name" and node.named_child_count:
                return self.fields(node.named_children[0])
            return [unescape_word(node.text.decode())]
        if kind == "raw_string":
            return [node.text.decode()[1:-1]]
        if kind == "ansi_c_string":
            return [node.text.decode()[2:-1]]
        if kind in ("string", "translated_string"):
            return self._string_fields(node)
        if kind in ("simple_expansion", "expansion"):
            return [word for value in self._expand(node) for word in value.split()]
        if kind == "command_substitution":
            return self._command_substitution(node)
        if kind == "arithmetic_expansion":
            return [self._arithmetic(node)]
        if kind == "concatenation":
            return self._concatenation(node)
        return [self._placeholder(node)]

    def _concatenation(self, node) -> list[str]:
        """Adjacent parts glue: the last field of one to the first of the next."""
        out = _Glue(None)
        for child in node.named_children:
            out.add(self.fields(child))
        return out.fields()

    def _text(self, node) -> str:
        kind = node.type
        if kind in ("simple_expansion", "expansion"):
            return joined(self._expand(node), " ")
        if kind == "command_substitution":
            return joined(self._command_substitution(node), " ")
        if kind == "concatenation":
            return joined(self.text(child) for child in node.named_children)
        return joined(self.fields(node), " ")

    def _string_fields(self, node) -> list[str]:
        """Expand "...": one field, except that "${X[@]}" yields one field per element, as in bash."""
        out, pos, src, base = _Glue(""), node.start_byte + 1, node.text, node.start_byte
        only_arrays = True
        for child in node.named_children:
            gap = _unescape_dquote(src[pos - base : child.start_byte - base].decode())
            only_arrays &= not gap
            if child.type == "string_content":
                values = [gap + _unescape_dquote(child.text.decode())]
                only_arrays = False
            elif _splits_in_quotes(child):
                values = self._expand(child) or [""]
                values[0] = gap + values[0]
            else:
                values = [gap + self.text(child)]
                only_arrays = False
            out.add(values)
            pos = child.end_byte
        tail = _unescape_dquote(src[pos - base : node.end_byte - 1 - base].decode())
        out.add([tail])
        fields = out.fields()
        if only_arrays and not tail and fields == [""] and node.named_child_count:
            return []  # "${EMPTY[@]}" is zero words
        return fields

    # ---- parameter expansion -----------------------------------------------------------------

    def _expand(self, node) -> list[str]:
        """`$X`, `${X}`, `${X[@]}`, `${X[i]}`, `${X:-d}`, `${#X[@]}`: the values (a list)."""
        ref = self._reference(node)
        if isinstance(ref, list):
            return ref
        name, index = ref
        anon = [child.type for child in node.children if not child.is_named]
        keys = "!" in anon and index in ("@", "*")  # ${!X[@]}: the keys or indices
        if set(anon) - {"$", "${", "}", "#", *_DEFAULT_OPS, *(["!"] if keys else [])}:  # ${X%...}, ${!X}: not modelled
            return [self._placeholder(node)]
        value = self._value(name)
        if keys:
            return [] if value is None else arrays.keys(value)
        if isinstance(value, dict) and index not in ("@", "*"):  # an associative array's element (`$M`: M[0])
            value, index = next(iter(arrays.element(value, index)), ""), None  # a missing key reads as empty
        op = next((o for o in anon if o in _DEFAULT_OPS), None)
        if op is not None:
            replaced = self._operator(name, value, op, node.named_children[1:])
            if replaced is not None:
                return replaced
        elif value is None and not self.empty_unset and not name.isdigit():
            self.unset.setdefault(name, line(node))
        if "#" in anon and node.children[1].type == "#":  # ${#X[@]} / ${#X}
            return [str(len(value) if isinstance(value, (list, dict)) else len(value or ""))]
        return self._lookup(node, name, index, value)

    def _reference(self, node) -> tuple[str, str | None] | list[str]:
        """(name, subscript) of an expansion, or its final value for special/positional ones."""
        head = node.named_children[0] if node.named_child_count else None
        if head is not None and head.type == "subscript":
            index_node = head.child_by_field_name("index")
            name = head.child_by_field_name("name").text.decode()
            index = self.text(index_node) if index_node is not None else None
        elif head is not None and head.type == "variable_name":
            name, index = head.text.decode(), None
        elif head is not None and head.type == "special_variable_name" and self.positional is not None:
            special = head.text.decode()  # "$@" "$*" "$#" inside a function the script calls
            if special in ("@", "*"):
                return list(self.positional)
            return [str(len(self.positional))] if special == "#" else [self._placeholder(node, "other")]
        else:  # $@, $$ ...: run-time values
            return [self._placeholder(node, "other")]
        if name in ("0", "BASH_SOURCE"):
            return [self.file]
        if name.isdigit() and self.positional is not None:  # $1, ${2} inside a function the script calls
            return name, index
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):  # $1, ${2} of the script: unknown
            return [self._placeholder(node, "other")]
        return name, index

    def _value(self, name: str):
        """A variable's value (a positional parameter's inside a function); None when unset."""
        if name.isdigit():
            position = int(name)
            arguments = self.positional or []
            return arguments[position - 1] if 0 < position <= len(arguments) else None
        return self.vars.get(name)

    def _operator(self, name: str, value, op: str, word_nodes) -> list[str] | None:
        """`:-`, `-`, `:=`, `=`, `:+`, `+`: the replacement, or None to use the value."""
        empty = value is None or value == "" or value == [] or value == {}
        missing = empty if op.startswith(":") else value is None
        word = joined((self.text(child) for child in word_nodes), " ")
        if op.endswith("+"):  # alternate value: only when set
            return [] if missing else [word]
        if not missing:
            return None
        if op.endswith("="):
            self.vars[name] = word
        return [word]

    def _lookup(self, node, name: str, index: str | None, value) -> list[str]:
        if value is None:
            if self.empty_unset:
                return [""]
            if index in ("@", "*"):  # unset array: expands to nothing, as in bash (recorded)
                if name not in self.unset_arrays:
                    self.unset_arrays.append(name)
                return []
            return [self._placeholder(node, "unset")]
        if index in ("@", "*"):
            return arrays.values(value)
        return arrays.element(value, index) if isinstance(value, list) else [value]

    # ---- command substitution and arithmetic -------------------------------------------------

    def _command_substitution(self, node) -> list[str]:
        small = node.end_byte - node.start_byte <= SNIPPET
        text = node.text.decode(errors="replace") if small else ""
        if "dirname" in text and ("BASH_SOURCE" in text or "$0" in text):
            # SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)" and friends
            return [str(Path(self.file).resolve().parent)]
        if node.text.startswith(b"$((") and node.text.endswith(b"))"):
            # tree-sitter-bash reads `${X:-$((A - B))}` as `$( (A - B) )`: re-parse it as arithmetic
            self.budget.charge([node.text])  # the re-parse is work too
            try:
                tree = parse(b"X=" + node.text, self.budget)
            except TooSlow:
                raise Cap("tree-sitter-bash did not finish parsing it in its time") from None
            value = tree.root_node.named_children[0].child_by_field_name("value")
            if value is not None and value.type == "arithmetic_expansion":
                return [self._arithmetic(value)]
        command = node.named_children[0] if node.named_child_count == 1 else None
        if command is not None and command.type == "command":
            name = command.child_by_field_name("name")
            words = self.words([name, *command.children_by_field_name("argument")]) if name is not None else []
            if words and words[0] == "seq" and 2 <= len(words) <= 4:
                return self._seq(node, words[1:])
        return [self._placeholder(node)]

    def _seq(self, node, words: list[str]) -> list[str]:
        """`seq LAST`, `seq FIRST LAST`, `seq FIRST STEP LAST` on integers."""
        if not all(re.fullmatch(r"-?[0-9]{1,18}", word) for word in words):
            return [self._placeholder(node)]
        numbers = [int(word) for word in words]
        first, step, last = (
            (1, 1, numbers[0])
            if len(numbers) == 1
            else ((numbers[0], 1, numbers[1]) if len(numbers) == 2 else tuple(numbers))
        )
        if step == 0:
            return [self._placeholder(node)]
        values = range(first, last + (1 if step > 0 else -1), step)
        if len(values) > MAX_ITEMS:
            raise Cap(f"`seq` gives {len(values):,} numbers, more than {MAX_ITEMS:,}")
        return [str(value) for value in values]

    def _arithmetic(self, node) -> str:
        """`$(( ... ))`: the value, or the text kept when an operand is not known."""
        evaluator = Evaluator(self._operand, self.budget.deeper)
        try:
            value = 0
            for child in node.named_children:
                value = evaluator.value(child)
            return str(value)
        except Unresolved:
            return self._placeholder(node)

    def _operand(self, node) -> int:
        """A variable (`X`) or an expansion (`$X`) inside `$(( ))` as an integer (Unresolved when not known)."""
        if node.type in ("simple_expansion", "expansion"):
            return int_or_raise(" ".join(self._expand(node)))
        if node.type == "subscript":  # M[tp] inside $(( ))
            name = node.child_by_field_name("name").text.decode()
            index_node = node.child_by_field_name("index")
            value = self.vars.get(name)
            if value is None:
                self.unset.setdefault(name, line(node))
                raise Unresolved(name)
            index = self.text(index_node) if index_node is not None else None
            return int_or_raise(" ".join(arrays.element(value, index)))
        name = node.text.decode()
        if name not in self.vars:
            self.unset.setdefault(name, line(node))
            raise Unresolved(name)
        return int_or_raise(self.vars[name])

    # ---- placeholders ------------------------------------------------------------------------

    def _placeholder(self, node, kind: str = "command", reason: str = "") -> str:
        text = snippet(node)
        self.made += 1
        if text in self.placeholders or len(self.placeholders) < MAX_PLACEHOLDERS:
            self.placeholders[text] = Placeholder(text, line(node), self.file, kind, reason)
        return text

    def capped(self, node, reason: str) -> str:
        """A placeholder for a value static reading gave up on, with its note."""
        text = self._placeholder(node, "limit", reason)
        self.budget.note(line(node), f"`{text}`: {reason}; kept as text")
        return text
