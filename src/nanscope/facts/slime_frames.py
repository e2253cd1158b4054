"""slime's frames in a training traceback, release by release: which line each function calls the next frame from.

A traceback's slime frames name the release when their lines are one release's (`launch.evidence`): the call in
each frame spans (first, last) lines of that release's file (Python reports the call's first line; older Pythons
one of its argument lines). The train command's own train.py is a copy in most launches (the case's is
`deepresearch/train.py`), so its lines only support a release the package's frames name.

    FRAMES[("slime/backends/megatron_utils/model.py", "train_one_step")]["v0.1.0"]   # (310, 319)
"""

from __future__ import annotations

from nanscope.facts.releases import MAIN, V0_1_0, V0_2_4, V0_3_1

_ACTOR = "slime/backends/megatron_utils/actor.py"
_MODEL = "slime/backends/megatron_utils/model.py"
PACKAGE = "slime/backends/"  # a frame under it is slime's own package (not a copy of train.py)

# (path suffix, function) -> {release: ((first, last) of each call to the next frame)}; checked against
# ../shared/slime-src by tests/facts/test_slime_frames.py
FRAMES: dict[tuple[str, str], dict[str, tuple[tuple[int, int], ...]]] = {
    ("train.py", "<module>"): {V0_1_0: ((89, 89),), V0_2_4: ((110, 110),), V0_3_1: ((99, 99),), MAIN: ((99, 99),)},
    ("train.py", "train"): {  # ray.get(actor_model.async_train(...)): with a critic, and without
        V0_1_0: ((61, 61),),
        V0_2_4: ((85, 85), (88, 88)),
        V0_3_1: ((65, 65), (69, 69)),
        MAIN: ((65, 65), (69, 69)),
    },
    (_ACTOR, "train"): {  # v0.1.0 calls model.train; later releases call self.train_actor
        V0_1_0: ((258, 265),),
        V0_2_4: ((376, 376),),
        V0_3_1: ((381, 381),),
        MAIN: ((387, 387),),
    },
    (_ACTOR, "train_actor"): {V0_2_4: ((483, 490),), V0_3_1: ((512, 520),), MAIN: ((525, 533),)},
    (_MODEL, "train"): {V0_1_0: ((431, 440),), V0_2_4: ((589, 598),), V0_3_1: ((824, 835),), MAIN: ((830, 841),)},
    (_MODEL, "train_one_step"): {
        V0_1_0: ((310, 319),),
        V0_2_4: ((420, 429),),
        V0_3_1: ((642, 651),),
        MAIN: ((648, 657),),
    },
}


def lines_at(suffix: str, function: str, release: str) -> tuple[tuple[int, int], ...]:
    """The (first, last) lines of the calls `function` in `suffix` makes to the next frame at `release` (() none)."""
    return FRAMES.get((suffix, function), {}).get(release, ())


def fits(suffix: str, function: str, line: int, release: str) -> bool:
    """The frame's line is one of that release's calls (first line to last)."""
    return any(first <= line <= last for first, last in lines_at(suffix, function, release))
