"""Which slime release a launch is for: `--slime-version`, else what the script names, else its flags.

In order: the release asked for (`--slime-version`, any spelling `nanscope.facts.releases.find` accepts); a
release the script's text names (a path `slime-0.2.4` or `slime_v0.3.1`, `pip install slime==0.2.4`, a
docker image `slimerl/slime:v0.3.1`, `slime@v0.2.4`, `slime@main` or main's commit); the releases whose
parsers accept every modelled flag the script gives (`launch.config.FLAGS`: `since`, `choices`),
the oldest of them when the flags rule some out; else v0.1.0, said as an assumption. The bundled case
is its own release (`case.RELEASE`) unless `--slime-version` says otherwise. A script that names a
release nanscope does not know, or two releases, is refused in one line: its defaults would be guessed. Between
what the script names and its flags: the release whose lines the traceback's slime frames are (`frames`).

    choose(None, "launch.sh", text, argv).source   # e.g. "launch.sh line 3 names it: slime-0.2.4"
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.facts.flags import FLAGS
from nanscope.launch.config import split_flags

_NUMBER = r"\d+\.\d+\.\d+"
# The other spellings of the known releases (main, its commit).
_WORDS = "|".join(
    sorted(
        {
            spelling
            for release in releases.RELEASES
            for spelling in release.spellings
            if not re.fullmatch(f"v?{_NUMBER}", spelling)
        }
    )
)
# `slime` followed by ==, -, _, @, : or / (a .git in between allowed), then a release number or one of those words.
_NAMED = re.compile(rf"\bslime(?:\.git)?(?:==|[-_@:/])v?(?P<name>{_NUMBER}|{_WORDS})(?![\w.])", re.IGNORECASE)
OVERRIDE = "pass --slime-version to choose another"


@dataclass(frozen=True)
class Choice:
    """The release a diagnosis uses and how it was chosen.

    Attributes:
        release: the release record.
        how: "option" (--slime-version), "script" (named in its text), "frames" (the traceback's slime frames are
            one release's lines), "flags", "case" or "assumed".
        source: the evidence, in words.
    """

    release: releases.SlimeRelease
    how: str
    source: str


def choose(
    asked: str | None,
    path: str,
    text: str,
    argv: list[str],
    case: str | None = None,
    frames: tuple[str, str] | None = None,
) -> Choice:
    """The release for a launch (see the module docstring).

    Args:
        asked: `--slime-version` as typed, or None.
        path: the script's name, for evidence and errors.
        text: the script's text.
        argv: the train command's resolved arguments.
        case: the bundled case's release key, when the script is the case's.
        frames: (release key, evidence) when the traceback's slime frames are one release's lines (launch.evidence).

    Raises:
        UserError: an unknown `asked`; a script naming an unknown release, or two.
    """
    if asked is not None:
        return Choice(releases.get(asked), "option", f"--slime-version {asked}")
    if case is not None:
        return Choice(releases.BY_KEY[case], "case", f"the bundled case ran slime {case}; {OVERRIDE}")
    named = _named(path, text)
    if named is not None:
        return named
    if frames is not None:
        return Choice(releases.BY_KEY[frames[0]], "frames", f"the traceback's {frames[1]}")
    return _by_flags(argv) or _assumed("nothing in the script names a release")


def named_release(text: str) -> bool:
    """The text names a slime release (known or not): evidence that the script is slime's."""
    return _NAMED.search(text) is not None


def _assumed(why: str) -> Choice:
    return Choice(releases.DEFAULT, "assumed", f"{why}; {OVERRIDE}")


def _named(path: str, text: str) -> Choice | None:
    """The release the script's text names, if one does."""
    found: dict[str, tuple[int, str]] = {}  # release key -> (line, text matched)
    for number, line in enumerate(text.splitlines(), 1):
        for named in _NAMED.finditer(line):
            release = releases.find(named["name"])
            if release is None:
                raise UserError(
                    f"{path}: line {number} names slime {named['name']} ({named[0]}), a release nanscope does not "
                    f"know (known: {', '.join(releases.KEYS)}); pass --slime-version to use the defaults of one"
                )
            found.setdefault(release.key, (number, named[0]))
    if len(found) > 1:
        shown = " and ".join(f"{key} (line {line}: {match})" for key, (line, match) in found.items())
        raise UserError(f"{path}: names two slime releases, {shown}; pass --slime-version to choose one")
    if not found:
        return None
    ((key, (line, match)),) = found.items()
    return Choice(releases.BY_KEY[key], "script", f"{path} line {line} names it: {match}")


def _by_flags(argv: list[str]) -> Choice | None:
    """The oldest release whose parser accepts every modelled flag given, when the flags rule one out."""
    given = split_flags(argv)
    accepted = set(releases.KEYS)
    evidence = []
    for spec in FLAGS:
        if spec.spelling not in given:
            continue
        words = given[spec.spelling]
        ok = {key for key in releases.KEYS if spec.defined_at(key) and _accepts(spec, key, words)}
        if ok != set(releases.KEYS):
            shown = " ".join([spec.spelling, *words[:1]])
            evidence.append(f"{shown} ({', '.join(key for key in releases.KEYS if key in ok) or 'no release'})")
        accepted &= ok
    if not evidence:
        return None
    if not accepted:
        return _assumed(f"the flags fit no one release: {'; '.join(evidence)}")
    keys = [key for key in releases.KEYS if key in accepted]
    return Choice(
        releases.BY_KEY[keys[0]],
        "flags",
        f"the flags fit {', '.join(keys)}: {'; '.join(evidence)}; the oldest is assumed, {OVERRIDE}",
    )


def _accepts(spec, release: str, words: list[str]) -> bool:
    choices = spec.choices_at(release)
    return not choices or (len(words) == 1 and words[0] in choices)
