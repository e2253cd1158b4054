"""Native code's error lines in a log, which name no NaN but may say what made one: a C++ library's diagnostic in
`file.cpp (line) : kind : message` form (NVIDIA PhysX, as Isaac Gym and Isaac Lab run it, prints its errors so).

    .../PxgAABBManager.cpp (1048) : invalid parameter : The application needs to increase
        PxgDynamicsMemoryConfig::foundLostAggregatePairsCapacity to -2014081303 , otherwise, ...

    scan(block, lines_before, found)   # appends (line, text) to `found`, at most MAX of them
    meaning(text) -> what a negative capacity it asks for says, or None
"""

from __future__ import annotations

import re

MAX = 3  # native error lines kept
_DIAGNOSTIC = re.compile(rb"[\w./-]{1,200}\.(?:cpp|cc|cu|cuh|hpp|h) ?\(\d{1,6}\) ?: [^:\n]{3,60} ?: [^\n]{0,400}")
# a size the code asks to raise to a negative number: a signed 32-bit count past 2^31 - 1 wraps negative
_NEGATIVE_ASK = re.compile(r"\b(?:increase|raise|set)\b[^\n]{0,120}?\bto (-\d{4,})\b", re.IGNORECASE)


def scan(block: bytes, lines_before: int, found: list[tuple[int, str]]) -> None:
    """The native diagnostics of `block` (whole lines; the log's lines before it: `lines_before`), into `found`."""
    if len(found) >= MAX or b") : " not in block and b"):" not in block:
        return
    for match in _DIAGNOSTIC.finditer(block):
        line = lines_before + block.count(b"\n", 0, match.start()) + 1
        found.append((line, match.group().decode("utf-8", "replace").strip()))
        if len(found) >= MAX:
            return


def meaning(text: str) -> str | None:
    """What the line's negative size says (None: it asks for none): the count it holds wrapped past 2^31."""
    match = _NEGATIVE_ASK.search(text)
    if match is None:
        return None
    return (f"it asks for a size of {match[1]}: a signed 32-bit count wrapped past 2^31 - 1, so what it counts "
            "exploded (in a physics simulator: contacts or pairs of bodies moving at huge or non-finite speeds, whose "
            "states the networks read as observations)")  # fmt: skip
