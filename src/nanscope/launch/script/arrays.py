"""Bash arrays as the launch reader keeps them: a list (an indexed array) or a dict (an associative one,
`declare -A M=([tp]=2)`), and what their expansions give.

An associative array expands (`${M[@]}`, `${!M[@]}`) in bash's order, not in the order it was written: bash 5
keeps it in a hash table of 1024 buckets (FNV-1 of the key's bytes, as signed chars), walks the buckets in
turn and, within one, lists the newest key first (checked against bash 5.2 for up to 2,048 keys; past that
bash grows the table and reorders it, so a larger array is kept as text). An indexed array here has no gaps:
`A[5]=x` past its end, or `A=([0]=a [2]=b)`, is kept as text too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from nanscope.launch.script.bounds import Cap

MAX_KEYS = 2048  # keys of an associative array whose order bash keeps
_BUCKETS = 1024  # bash's ASSOC_HASH_BUCKETS
_FNV_OFFSET, _FNV_PRIME = 2166136261, 16777619
_INDEX = re.compile(r"-?[0-9]{1,18}")

Value = str | list[str] | dict[str, str]


def bash_order(keys: Iterable[str]) -> list[str]:
    """The order in which bash lists the keys of an associative array they were added to in this order."""
    buckets: dict[int, list[str]] = {}
    for key in keys:
        buckets.setdefault(_fnv1(key) & (_BUCKETS - 1), []).insert(0, key)
    return [key for bucket in sorted(buckets) for key in buckets[bucket]]


def _fnv1(key: str) -> int:
    """bash's hash_string: 32-bit FNV-1 of the key's bytes, each a C `char`: signed, as on x86-64 (a byte past
    0x7f is sign-extended; where `char` is unsigned, as on ARM, non-ASCII keys hash otherwise)."""
    value = _FNV_OFFSET
    for byte in key.encode("utf-8", "surrogateescape"):
        value = ((value * _FNV_PRIME) & 0xFFFFFFFF) ^ (byte | 0xFFFFFF00 if byte > 0x7F else byte)
    return value


def checked(array: dict[str, str]) -> dict[str, str]:
    """`array`, or a Cap when bash's order of its keys is not the one `bash_order` gives."""
    if len(array) > MAX_KEYS:
        raise Cap(f"an associative array of more than {MAX_KEYS:,} keys (bash reorders a larger one)")
    return array


def values(value: Value) -> list[str]:
    """`${X[@]}`: every element, in bash's order."""
    if isinstance(value, dict):
        return [value[key] for key in bash_order(value)]
    return list(value) if isinstance(value, list) else [value]


def keys(value: Value) -> list[str]:
    """`${!X[@]}`: the keys (an associative array, in bash's order) or the indices."""
    if isinstance(value, dict):
        return bash_order(value)
    return [str(i) for i in range(len(value))] if isinstance(value, list) else ["0"]


def element(value: Value, index: str | None) -> list[str]:
    """`${X[i]}` (`$X` is element 0): the element, or nothing when there is none."""
    if isinstance(value, dict):
        key = "0" if index is None else index
        return [value[key]] if key in value else []
    if isinstance(value, str):
        value = [value]
    position = position_of(index)
    return [value[position]] if -len(value) <= position < len(value) else []


def position_of(index: str | None) -> int:
    """An indexed array's subscript as written or expanded: a number, else 0 (bash's value of an unset name)."""
    return int(index) if index and _INDEX.fullmatch(index.strip()) else 0


def set_element(old: Value | None, index: str, new: str, append: bool) -> Value:
    """The array after `X[index]=new` (`+=`: appended to the element); Cap past an indexed array's end."""
    if isinstance(old, dict):
        return checked({**old, index: old.get(index, "") + new if append else new})
    items = [] if old is None else [old] if isinstance(old, str) else list(old)
    if not _INDEX.fullmatch(index.strip()):
        raise Cap(f"subscript {index!r} is not a number known statically")
    position = int(index)
    position += len(items) if position < 0 else 0
    if 0 <= position < len(items):
        items[position] = items[position] + new if append else new
    elif position == len(items):
        items.append(new)
    else:
        raise Cap(f"element {index} past the array's end (a sparse array)")
    return items
