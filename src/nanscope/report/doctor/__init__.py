"""Rendering a `nanscope doctor` Diagnosis: JSON-ready dict, rich terminal report, self-contained HTML.

The terminal report reads top-down: verdict, failing rank, layout, findings, then what is fine,
the annotated traceback and the input notes. Layers are 0-based everywhere (Megatron's
`layer_number` is 1-based).

    verdict.py    the first paragraph: where, why it died, which flags enable which mechanism
    shared.py     what every renderer writes the same way: rank groups, stages, the release, key flags
    document.py   the JSON document (`--json`)
    terminal.py   the rich terminal report (imports rich)
    page.py       the HTML page, with its rank grid and layer split drawn in SVG (`--html`)
"""
