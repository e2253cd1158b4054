"""Bash integer arithmetic on known values: `$(( ... ))` and the integer tests of `[ ... ]`.

Arithmetic is bash's signed 64-bit, and numbers follow bash's rules (`017` octal, `0x1f`,
`base#digits`). What bash would reject (`08`, `65#1`, division by 0) or what overflows raises
`bounds.Cap` (the reader keeps the text, with a note); an operand that is not a known integer raises
`Unresolved` (the reader keeps the text as a run-time value).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from contextlib import AbstractContextManager

from nanscope.launch.script.bounds import Cap

_INT64 = 1 << 63  # bash arithmetic is signed 64-bit
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"  # bash's base#digits
_CONSTANT = r"[0-9][0-9A-Za-z@_#]*"  # what bash reads as an integer constant (then checks)

_OPERATORS = {
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
    "&&": lambda left, right: bool(left and right),
    "||": lambda left, right: bool(left or right),
}

# bash's binary operators, tighter first (man bash, ARITHMETIC EVALUATION); `**` is right-associative
_PRECEDENCE = {
    "**": 13, "*": 12, "/": 12, "%": 12, "+": 11, "-": 11, "<<": 10, ">>": 10,
    "<": 9, ">": 9, "<=": 9, ">=": 9, "==": 8, "!=": 8, "&": 7, "^": 6, "|": 5, "&&": 4, "||": 3,
}  # fmt: skip

_INT_TESTS = {
    "-eq": int.__eq__,
    "-ne": int.__ne__,
    "-gt": int.__gt__,
    "-ge": int.__ge__,
    "-lt": int.__lt__,
    "-le": int.__le__,
}


class Unresolved(Exception):
    """An arithmetic operand that is not a known integer."""


class Evaluator:
    """Evaluates tree-sitter-bash's arithmetic expression nodes.

    Args:
        operand: the integer a variable (`X`), an element (`M[tp]`) or an expansion (`$X`) holds; raises
            Unresolved when it is not a known integer.
        deeper: entered once per operation: the reader's bounds (a Cap past them).
    """

    def __init__(self, operand: Callable[[object], int], deeper: Callable[[], AbstractContextManager]):
        self.operand = operand
        self.deeper = deeper

    def value(self, node) -> int:
        """The expression's value."""
        with self.deeper():
            return _int64(self._evaluate(node))

    def _evaluate(self, node) -> int:
        kind = node.type
        if kind == "number":
            return _bash_int(node.text.decode())
        if kind in ("variable_name", "word"):
            name = node.text.decode()
            if re.fullmatch(f"-?{_CONSTANT}", name):
                return -_bash_int(name[1:]) if name.startswith("-") else _bash_int(name)
            return self.operand(node)
        if kind in ("simple_expansion", "expansion", "subscript"):
            return self.operand(node)
        if kind == "parenthesized_expression":
            return self.value(node.named_children[0])
        if kind in ("unary_expression", "binary_expression"):
            tokens: list[tuple[str, object]] = []
            self._flatten(node, tokens)
            value, end = self._climb(tokens, 0, 0)
            if end != len(tokens):  # an operator bash has but nanscope does not model (`=`, `+=`, `,`)
                raise Unresolved(str(tokens[end][1]))
            return value
        if kind == "ternary_expression":
            condition, if_true, if_false = node.named_children
            return self.value(if_true) if self.value(condition) else self.value(if_false)
        raise Unresolved(kind)

    def _flatten(self, node, out: list[tuple[str, object]]) -> None:
        """The operators and operands of a chain of unary and binary expressions, left to right: tree-sitter-bash
        binds a unary operator looser than any binary one (`0 - -0 + 1` is read 0 - -(0 + 1)), bash tighter, so
        the chain is read again with bash's precedence (`_climb`)."""
        with self.deeper():
            if node.type == "binary_expression":
                self._flatten(node.child_by_field_name("left"), out)
                out.append(("op", node.child_by_field_name("operator").type))
                self._flatten(node.child_by_field_name("right"), out)
            elif node.type == "unary_expression":
                out.append(("unary", node.children[0].type))
                self._flatten(node.named_children[0], out)
            else:
                out.append(("operand", node))

    def _climb(self, tokens: list[tuple[str, object]], pos: int, lowest: int) -> tuple[int, int]:
        """Precedence climbing over `tokens` from `pos`, operators binding at least `lowest`: (value, next position)."""
        with self.deeper():
            value, pos = self._prefixed(tokens, pos)
            while pos < len(tokens) and _PRECEDENCE.get(tokens[pos][1], -1) >= lowest:
                op = tokens[pos][1]
                precedence = _PRECEDENCE[op]
                right, pos = self._climb(tokens, pos + 1, precedence if op == "**" else precedence + 1)
                value = _int64(_binary(op, value, right))
            return value, pos

    def _prefixed(self, tokens: list[tuple[str, object]], pos: int) -> tuple[int, int]:
        """An operand and the unary operators before it (bash binds them tighter than any binary operator)."""
        ops = []
        while tokens[pos][0] == "unary":
            ops.append(tokens[pos][1])
            pos += 1
        value = self.value(tokens[pos][1])
        for op in reversed(ops):
            value = _int64({"-": -value, "+": value, "!": int(not value), "~": ~value}.get(op, value))
        return value, pos + 1


def int_or_raise(value: str | list[str] | dict[str, str]) -> int:
    """A variable's value as an arithmetic operand (an array: its first element); Unresolved if not an integer."""
    if isinstance(value, dict):  # an associative array: its element "0", as bash reads $M
        value = value.get("0", "")
    if isinstance(value, list):
        value = value[0] if value else ""
    match = re.fullmatch(f"([-+]?)({_CONSTANT})", value.strip())
    if match is None:
        raise Unresolved(value)
    number = _bash_int(match[2])
    return -number if match[1] == "-" else number


def compare(op: str, values: list[str]) -> bool | None:
    """`[ -n A ]`, `[ -z A ]`, `[ A op B ]` on known values (`=`, `!=`, `-eq`, `-lt`, ...); None when undecided."""
    if op == "-n" and len(values) == 1:
        return bool(values[0])
    if op == "-z" and len(values) == 1:
        return not values[0]
    if len(values) != 2:
        return None
    left, right = values
    if op in ("=", "=="):
        return left == right
    if op == "!=":
        return left != right
    if (
        op in _INT_TESTS
        and re.fullmatch(r"-?[0-9]{1,18}", left.strip())
        and re.fullmatch(r"-?[0-9]{1,18}", right.strip())
    ):
        return _INT_TESTS[op](int(left), int(right))
    return None


def _bash_int(text: str) -> int:
    """An integer constant as bash reads it: `017` octal, `0x1f` hex, `base#digits` (base 2..64), else decimal.

    Raises:
        Cap: what bash rejects (`08`, `65#1`, `2#`), or a value past its signed 64 bits.
    """
    head, sep, digits = text.partition("#")
    if sep:
        base = int(head) if re.fullmatch(r"[0-9]{1,2}", head) else 0
        if not 2 <= base <= 64:
            raise Cap(f"{text}: invalid arithmetic base")
    elif re.match(r"0[xX]", text):
        base, digits = 16, text[2:] or "0"  # bash reads a bare `0x` as 0
    elif text.startswith("0"):
        base, digits = 8, text
    else:
        base, digits = 10, text
    if not digits:
        raise Cap(f"{text}: invalid integer constant")
    value = 0
    for char in digits:
        digit = _DIGITS.find(char.lower() if base <= 36 else char)  # up to base 36 letters are case-insensitive
        if not 0 <= digit < base:
            raise Cap(f"{text}: value too great for base")
        value = _int64(value * base + digit)
    return value


def _int64(value: int) -> int:
    if not -_INT64 <= value < _INT64:
        raise Cap("overflows bash's signed 64-bit arithmetic")
    return value


def _binary(op: str, left: int, right: int) -> int:
    """One bash arithmetic operator on 64-bit operands (a Cap where bash stops, or on overflow)."""
    if op in ("/", "%"):
        if right == 0:
            raise Cap("division by 0")
        quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)  # bash truncates toward 0
        return quotient if op == "/" else left - right * quotient
    if op == "**":
        if right < 0:
            raise Cap("exponent less than 0")
        if abs(left) > 1 and right >= 64:  # |left|**64 >= 2**64: checked before it is computed
            raise Cap("overflows bash's signed 64-bit arithmetic")
        return left**right
    if op in ("<<", ">>"):
        if not 0 <= right < 64:  # bash shifts by the count modulo 64 on x86: machine-dependent
            raise Cap(f"shift count {right} is outside 0..63")
        return left << right if op == "<<" else left >> right
    if op not in _OPERATORS:
        raise Unresolved(op)
    return int(_OPERATORS[op](left, right))
