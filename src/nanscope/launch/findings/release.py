"""Rules on the release itself: flags its parser does not define, values its parser rejects.

These two name the script's flags the release lacks, and nanscope's --slime-version.
"""

from __future__ import annotations

from nanscope.facts import releases
from nanscope.facts.flags import BY_SPELLING
from nanscope.launch.config import Config
from nanscope.launch.findings.finding import Finding, release_of


def undefined(cfg: Config) -> Finding | None:
    """Modelled flags the script gives that the release's parser does not define."""
    if not cfg.undefined:
        return None
    release = release_of(cfg)
    spans = "; ".join(f"{flag} is defined from {BY_SPELLING[flag].since}" for flag in cfg.undefined)
    refused = release.unknown_flags == "refused"
    mechanism = (
        f"slime {release.key}'s parser does not define {', '.join(cfg.undefined)} and "
        + ("refuses unknown arguments" if refused else "ignores unknown arguments")
        + f" ({release.parser_at}). "
        + ("The run does not start." if refused else "They are dropped without a word: what they turn on stays off.")
    )
    several = len(cfg.undefined) > 1
    return Finding(
        id="flag-not-in-release",
        severity="critical" if refused else "medium",
        title=f"{'flags' if several else 'a flag'} slime {release.key} does not define",
        flags=list(cfg.undefined),
        mechanism=mechanism,
        fix=f"remove {'them' if several else 'it'}, or run the release that defines "
        f"{'them' if several else 'it'} ({spans}); if the script is for another release, "
        "pass --slime-version.",
    )


def rejected(cfg: Config) -> Finding | None:
    """Values the release's parser rejects (argparse choices): the run does not start."""
    if not cfg.rejected:
        return None
    release = release_of(cfg)
    flags = [f"{flag} {value}" for flag, value, _ in cfg.rejected]
    why = "; ".join(f"{flag} accepts {', '.join(choices)}" for flag, _, choices in cfg.rejected)
    elsewhere = "; ".join(
        f"{flag} {value} is {', '.join(keys)}'s spelling"
        for flag, value, _ in cfg.rejected
        if (keys := [key for key in releases.KEYS if value in BY_SPELLING[flag].choices_at(key)])
    )
    return Finding(
        id="value-not-in-release",
        severity="critical",
        title=f"slime {release.key} rejects {', '.join(flags)}",
        flags=flags,
        mechanism=f"slime {release.key}'s parser checks these values against its choices ({why}). Any other "
        "value is an argparse error: the run does not start.",
        fix="one of the accepted values" + (f" ({elsewhere})" if elsewhere else "") + "; if the script is for "
        "another release, pass --slime-version.",
    )
