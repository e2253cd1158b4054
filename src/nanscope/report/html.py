"""The shell of every self-contained HTML report: one file, inline CSS and SVG, no network."""

from __future__ import annotations

import html

from nanscope.inputs import printable


def esc(text: str, quote: bool = True) -> str:
    """`text` for the page: HTML-escaped, each control character but a newline as repr() writes it (`\\x1b`,
    `\\x9b`), so that no string from a file (a dump's path, a log's line) reaches a page raw."""
    return html.escape("\n".join(map(printable, text.split("\n"))), quote)


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.bad{color:#b00020;font-weight:600}.ok{color:#1b7f3b}.muted{color:#777}
code,pre{font-family:ui-monospace,monospace;font-size:12.5px}pre{background:#f7f7f7;padding:.6em;overflow:auto}
"""


def page(title: str, body: str) -> str:
    """Return a complete HTML document.

    Args:
        title: plain text; escaped here.
        body: trusted HTML built by the report renderers (escape user text with `esc`).
    """
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f"<body><h1>{esc(title)}</h1>\n{body}\n</body></html>\n"
    )
