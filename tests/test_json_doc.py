"""docs/json.md lists the top-level keys the cheap commands' --json really has: hazards, doctor --case slime-795,
scan of one file and trace --hazard, each run in-process and its document's keys compared with its section's rows.

The page's convention: a row's first cell names keys in backticks, by their path from the document's root; a key
with no `.`, no `[` and no `<` is a top-level key; a row whose meaning starts with `*Only` is a key that some
documents of the section lack."""

import json
import pathlib
import re

import pytest

from nanscope.cli.main import main

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "json.md"


def _section(heading: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def top_level(heading: str) -> tuple[set[str], set[str]]:
    """(every top-level key the section lists, those it marks *Only*: absent from some documents)."""
    listed, optional = set(), set()
    for line in _section(heading).splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        keys = {key for key in re.findall(r"`([^`]+)`", cells[0]) if not re.search(r"[.\[<]", key)}
        listed |= keys
        if cells[2].startswith("*Only"):
            optional |= keys
    return listed, optional


def _hazards(tmp_path) -> list[str]:
    return ["hazards"]


def _doctor(tmp_path) -> list[str]:
    return ["doctor", "--case", "slime-795"]


def _scan(tmp_path) -> list[str]:
    dump = str(tmp_path / "12.pt")
    assert main(["scan", "--write-demo", dump]) == 0
    return ["scan", dump]


def _trace(tmp_path) -> list[str]:
    return ["trace", "--hazard", "kl-exp-overflow"]


CASES = {
    "`nanscope hazards`": _hazards,
    "`nanscope doctor`": _doctor,
    "`nanscope scan FILE`": _scan,
    "`nanscope trace --hazard NAME`, `nanscope trace FILE.pt`": _trace,
}


@pytest.mark.parametrize("heading", list(CASES))
def test_the_page_lists_the_top_level_keys_of(heading, tmp_path, capsys):
    argv = CASES[heading](tmp_path) + ["--json", str(tmp_path / "out.json")]
    assert main(argv) in (0, 1), argv
    capsys.readouterr()
    keys = set(json.loads((tmp_path / "out.json").read_text()))
    listed, optional = top_level(heading)
    assert keys - listed == set(), f"{heading}: keys the command writes and docs/json.md does not list"
    assert (listed - optional) - keys == set(), f"{heading}: keys docs/json.md lists and the command does not write"


def test_the_convention_reads_what_the_page_says():
    """A nested key is not top-level, a row of several keys gives each, a row marked *Only is optional."""
    listed, optional = top_level("`nanscope repro --hazard NAME`, `--fault SPEC`")
    assert {"trace", "trace_rank", "traceback", "launcher"} <= listed
    assert optional == {"trace", "trace_rank", "traceback", "launcher"}
    listed, optional = top_level("`nanscope doctor`")
    assert "config" in listed and "failure" in listed and not any("." in key for key in listed)
    assert optional == set()
