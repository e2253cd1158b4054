"""Writing a report to a user-named path: one clear line (UserError) when the path can't take it.

check_writable(path)      before a long run: the directory exists and accepts a file
write_text(path, text)    HTML, terminal transcripts
write_json(path, doc)     every command's --json
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nanscope.errors import UserError


def check_writable(path: str | os.PathLike, flag: str = "--json") -> None:
    """Fail before the work, not after it: `path`'s directory exists and is writable, `path` is no directory."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UserError(f"{flag} {path}: is a directory")
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: no such directory: {parent}")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{flag} {path}: directory not writable: {parent}")


def write_text(path: str | os.PathLike, text: str, flag: str = "--html") -> None:
    """Write `text` to `path`; an OSError is one line naming the flag and the path."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write: {e.strerror or e}") from None


def write_json(path: str | os.PathLike, doc, flag: str = "--json") -> None:
    """`doc` as indented JSON (NaN and inf as JSON's NaN/Infinity, as json.dump writes them)."""
    write_text(path, json.dumps(doc, indent=1) + "\n", flag)
