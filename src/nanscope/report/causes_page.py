"""docs/causes.md: the cause catalogue as `nanscope.causes` holds it, written from the records so it cannot drift.

    python -m nanscope.report.causes_page > docs/causes.md

tests/test_docs.py fails when the page in docs/ is not what `render()` gives.
"""

from __future__ import annotations

from nanscope.causes import catalogue, immune, reported

HEADER = """\
# The cause catalogue

Generated from `src/nanscope/causes/` by `python -m nanscope.report.causes_page > docs/causes.md`; do not edit by
hand (tests/test_docs.py fails when this page and the records differ). Three kinds of cause, each with the flags
that enable it, its class and the one observation that tells it apart:

- [built hazards](#built-hazards): nanscope builds, plants or runs each (`nanscope hazards`, `nanscope repro --all`);
- [causes from real reports](#causes-from-real-reports): doctor weighs them from a launch's flags, repro does not
  build them;
- [causes slime is immune to](#causes-slime-is-immune-to): real RL runs hit them, slime's code rules them out.
"""


def _cell(text: str) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|") or "-"


def _hazards() -> list[str]:
    rows = [
        "## Built hazards",
        "",
        "`nanscope repro --all` runs each under slime v0.1.0's loss (as-is) and the fix (safe); `nanscope repro` "
        "alone runs " + ", ".join(f"`{h.name}`" for h in catalogue.CASE_HAZARDS) + " (the case's own).",
        "",
        "| hazard | class | level | enabled by | as-is: loss, gradient | mechanism | fix | tells it apart |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in catalogue.CATALOGUE:
        finite = f"{'finite' if h.loss_finite else 'NaN'}, {'finite' if h.grad_finite else 'NaN'}"
        level = h.level + (f" (`{h.fault}`)" if h.fault else "")
        cells = (f"`{h.name}`", h.cause_class or "-", level, ", ".join(f"`{f}`" for f in h.flags) or "-", finite,
                 h.mechanism, h.fix, h.discriminator)  # fmt: skip
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def _reported() -> list[str]:
    rows = [
        "## Causes from real reports",
        "",
        "| cause | class | enabled by | mechanism | tells it apart | evidence |",
        "|---|---|---|---|---|---|",
    ]
    for r in reported.REPORTED:
        cells = (f"`{r.name}`", r.cause_class, ", ".join(f"`{f}`" for f in r.flags) or "-", r.mechanism,
                 r.discriminator, "; ".join(r.evidence))  # fmt: skip
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def _immune() -> list[str]:
    rows = [
        "## Causes slime is immune to",
        "",
        "| cause | class | what would go wrong | why slime cannot | evidence |",
        "|---|---|---|---|---|",
    ]
    for c in immune.IMMUNE:
        cells = (f"`{c.name}`", c.cause_class, c.cause, c.why, "; ".join(c.evidence))
        rows.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return rows


def render() -> str:
    """The whole page."""
    parts = [HEADER.rstrip("\n"), "", *_hazards(), "", *_reported(), "", *_immune()]
    return "\n".join(parts) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
