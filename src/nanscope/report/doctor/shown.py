"""The diagnosis as the terminal and the HTML page show it: every string read from a file cleaned of control
characters before any renderer sees it.

A log, a launch script or a pasted traceback may hold terminal escapes (ESC c resets the terminal, ESC ( 0 switches
its character set, an OSC retitles it or writes the clipboard, 8-bit C1 controls such as U+009B act as CSI) in a
node name, a frame's path or function, a message, a flag's value. The terminal report and the HTML page are built
from a copy of the diagnosis in which each string is `inputs.printable` of itself (each C0 and C1 control, DEL and
every other unprintable character written as repr() writes it: `\\x1b`, `\\x9b`); the JSON (`--json`) keeps the
text as read, faithful, and json.dumps writes every such character as a `\\u` escape, so the file holds none raw.
"""

from __future__ import annotations

import dataclasses

from nanscope.inputs import printable


def shown(value):
    """A copy of `value` (a Diagnosis, or anything in one) with every string printable; other values as they are."""
    if isinstance(value, str):
        return value if value.isprintable() else printable(value)
    if isinstance(value, list):
        return [shown(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(shown(item) for item in value)
    if isinstance(value, dict):
        return {shown(key): shown(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {field.name: shown(getattr(value, field.name)) for field in dataclasses.fields(value) if field.init}
        return dataclasses.replace(value, **changes)
    return value
