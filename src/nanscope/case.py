"""The bundled case, slime-795, read once from its own files: every other module asks here.

    python -c "from nanscope import case; print(case.loss_flags()); print(case.frames())"

The case's loss flags come from its `launch.sh` through nanscope's own static launch reader (with
`ENV`, the one value the script reads from its environment), its Megatron message and frames from
its `traceback.txt` through the traceback parser. Nothing here is typed by hand except `ENV`.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

NAME = "slime-795"
RELEASE = "v0.1.0"  # the slime release the case ran (its README.md); doctor --case uses its defaults
# The only value launch.sh reads from its environment: 8 nodes x 8 GPUs = the case's 64 H100s.
ENV = {"TOTAL_NODES": "8"}
FILES = ("launch.sh", "model.json", "traceback.txt")


def root():
    """The case's directory inside the installed package (a Traversable)."""
    return resources.files("nanscope") / "cases" / NAME


def text(name: str) -> str:
    """One of the case's files as text."""
    assert name in FILES, name
    return (root() / name).read_text()


@cache
def config():
    """The case's launch.sh resolved with slime's defaults (launch.config.Config)."""
    from nanscope.launch.config import resolve
    from nanscope.launch.script import parse_script

    with resources.as_file(root() / "launch.sh") as path:
        script = parse_script(path, ENV)
    model = json.loads(text("model.json"))
    return resolve(script.argv, model, f"model.json (bundled with {NAME})", script.unset, release=RELEASE)


@cache
def loss_flags() -> dict[str, object]:
    """The loss fields (slime_args.LOSS_FIELDS) that the case's launch.sh sets, as slime resolves them.

    global_batch_size is a batch shape, not a loss flag: callers pass the batch they build.
    """
    from nanscope.launch.config import SCRIPT
    from nanscope.slime_args import LOSS_FIELDS

    cfg = config()
    return {k: cfg[k] for k in LOSS_FIELDS if k != "global_batch_size" and cfg.origin(k) == SCRIPT}


@cache
def traceback():
    """The case's traceback, parsed (launch.tracebacks.Traceback)."""
    from nanscope.launch.tracebacks import parse_traceback

    return parse_traceback(text("traceback.txt"), f"{NAME}/traceback.txt")


@cache
def frames() -> tuple[tuple[str, int, str], ...]:
    """The traceback's megatron-core frames, outermost first: (file basename, line, function)."""
    return tuple(
        (f.path.replace("\\", "/").rsplit("/", 1)[-1], f.line, f.function)
        for f in traceback().frames
        if "/megatron/core/" in f.path.replace("\\", "/")
    )


@cache
def nan_check_message() -> str:
    """megatron-core's message without the "Rank R, node N, device D, iteration I: " prefix."""
    f = traceback().failure
    return f"Unexpected result {f.result} (message='{f.message}')"


def temperature() -> float:
    """--rollout-temperature of the case."""
    return float(loss_flags()["rollout_temperature"])


def group_size() -> int:
    """--n-samples-per-prompt of the case."""
    return int(loss_flags()["n_samples_per_prompt"])
