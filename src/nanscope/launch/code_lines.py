"""The known code lines (facts.code_lines) of a traceback's text, wherever they sit: alone under their frame, or glued
to another process's line where several wrote one stream at once and their newlines were lost:

        self.optimizer.step()self.deepspeed_engine_wrapped.backward(loss, **kwargs)
        train_result = trainer.train()tr_loss_step = self.training_step(model, inputs)
    tr_loss_step = self.training_step(model, inputs)  File "/root/LLaMA2/src/train_bash.py", line 10, in main

A text counts where it is a whole statement: nothing but indentation, a closing bracket or quote (the end of a
line glued before it) or a run of spaces (another line's indentation) before it; the line's end, `File "`, a run of
spaces or a statement glued on (a letter right after its closing `)`) after it. Each text is found by a literal
search: linear in the line.

    hits = read(lines)                 # each known line once, in the order first met
    hits = owned(hits, names)          # a text other libraries print too, read as its stack's where `names` has it
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nanscope.facts.code_lines import LINES, CodeLine
from nanscope.facts.frameworks import PATHS
from nanscope.facts.signals import BY_ID, Signal

WINDOW = 8192  # characters of a line looked at
_OPEN = (")", "]", "}", "'", '"')  # what ends a line glued right before a statement


@dataclass(frozen=True)
class CodeHit:
    """A known code line met in the text: where first and last (line index, column), and whether it is read as its
    table entry's stack's (a shared text is, only where something else names that stack)."""

    code: CodeLine
    first: tuple[int, int]
    last: tuple[int, int]
    owned: bool = True


def read(lines: list[str]) -> list[CodeHit]:
    """The known code lines of `lines`, each once, in the order first met."""
    found: dict[str, CodeHit] = {}
    for index, line in enumerate(lines):
        text = line[:WINDOW]
        if "(" not in text:
            continue
        lead, tail = len(text) - len(text.lstrip()), len(text.rstrip())  # where its indentation, its text end
        for code in LINES:
            at = text.find(code.text)
            while at >= 0:
                if _whole(text, at, code.text, (lead, tail)):
                    hit = found.get(code.text)
                    found[code.text] = CodeHit(code, hit.first if hit else (index, at), (index, at))
                at = text.find(code.text, at + len(code.text))
    return sorted(found.values(), key=lambda hit: hit.first)


def _whole(line: str, at: int, text: str, edges: tuple[int, int]) -> bool:
    """The text at `at` is a statement of its own (not part of a longer one); `edges`: where the line's indentation
    and its text end."""
    lead, tail = edges
    starts = at <= lead or line[at - 1] in _OPEN or (at >= 2 and line.startswith("  ", at - 2))
    if not starts:
        return False
    if text.endswith("("):  # the first line of a call written over several: its arguments follow
        return True
    end = at + len(text)
    follows = line[end : end + 1]
    glued = follows.isalpha() or follows == "_"  # `f(x)self.g(y)`: the next line glued on
    spaced = line.startswith("  ", end) or line.startswith(' File "', end)  # another line's indentation, a frame
    return end >= tail or glued or spaced


def named_stacks(hits: list[CodeHit], frames, framework: str) -> set[str]:
    """The stacks the text names besides the shared code lines: the framework, the unshared lines' stacks, the
    frames' paths (facts.frameworks.PATHS)."""
    names = {framework} | {hit.code.stack for hit in hits if not hit.code.shared}
    paths = ["/" + frame.path.replace("\\", "/").lstrip("/") for frame in frames]
    names |= {name for name, dirs in PATHS.items() if any(d in path for d in dirs for path in paths)}
    return names


def owned(hits: list[CodeHit], names: set[str]) -> list[CodeHit]:
    """The hits, a shared text read as its stack's only where `names` (launch.code_lines.named_stacks) has it."""
    return [replace(hit, owned=not hit.code.shared or hit.code.stack in names) for hit in hits]


def last(hits: list[CodeHit]) -> CodeHit | None:
    """The hit met last in the text (the innermost frame any process printed before the text ends), or None."""
    return max(hits, key=lambda hit: hit.last, default=None)


def pointed(hits: list[CodeHit]) -> tuple[CodeHit, Signal] | None:
    """The last hit, where it is read as its stack's and its call raises one error alone (facts.code_lines `raises`),
    and that error's evidence (facts.signals); None otherwise."""
    hit = last(hits)
    if hit is None or not hit.owned or hit.code.points is None:
        return None
    return hit, BY_ID[hit.code.points]


def points_to(hits: list[CodeHit]) -> str | None:
    """What the frames point to, in words, where the last code line's call raises one error alone: that error, said
    as the frames' pointer, not as the error line the text lacks; None otherwise."""
    found = pointed(hits)
    if found is None:
        return None
    hit, signal = found
    return (f"{hit.code.raises} ({signal.source}): the call on the last known code line, `{hit.code.text}`; what the "
            "frames point to, the error line itself cut")  # fmt: skip


def whose(hit: CodeHit) -> str:
    """Whose frame the line is, in words, with the release and line read (and the others', for a shared text not
    read as its stack's)."""
    code = hit.code
    own = f"{code.library} ({code.where})"
    if hit.owned:
        return own
    return " or ".join([own] + [f"{name}'s ({where})" for name, where in code.shared])


def evidence_lines(hits: list[CodeHit]) -> list[str]:
    """The code lines, one sentence each: what frame each is and what its call does."""
    return [f"code line `{hit.code.text}`: {whose(hit)}: {hit.code.does}" for hit in hits]


def to_dicts(hits: list[CodeHit]) -> list[dict]:
    return [
        {
            "text": hit.code.text,
            "library": hit.code.library if hit.owned else None,
            "stack": hit.code.stack if hit.owned else None,
            "where": hit.code.where,
            "shared": [where for _, where in hit.code.shared],
        }
        for hit in hits
    ]
