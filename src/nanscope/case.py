"""The bundled case, slime-795, read once from its own files, at the top: entry points ask here and pass values down.

    python -c "from nanscope import case; print(case.loss_flags()); print(case.frames())"

The case's loss flags come from its `launch.sh` through nanscope's own static launch reader (with
`ENV`, the one value the script reads from its environment), its Megatron message and frames from
its `traceback.txt` through the traceback parser. Nothing here is typed by hand except `ENV`.

Only the entry points (`repro`, `equivalence`, `report/`, `cli/`) import this module: every layer below
takes the case's values as arguments (the harness gets the loss flags inside its worker spec).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import TYPE_CHECKING

from nanscope.dumps.flags import ScanFlags
from nanscope.facts.args import LOSS_FIELDS, loss_args
from nanscope.facts.flags import SCRIPT
from nanscope.launch import unread
from nanscope.launch.config import Config, resolve
from nanscope.launch.script import parse_script
from nanscope.launch.tracebacks import Traceback, parse_traceback

if TYPE_CHECKING:
    from nanscope.hazards import Rollout

NAME = "slime-795"
RELEASE = "v0.1.0"  # the slime release the case ran (its README.md); doctor --case uses its defaults
# The only value launch.sh reads from its environment: 8 nodes x 8 GPUs = the case's 64 H100s.
ENV = MappingProxyType({"TOTAL_NODES": "8"})
FILES = ("launch.sh", "model.json", "traceback.txt")
# The harness's own world, the one `nanscope repro` runs (TP2 PP2, 1 node x 4 GPUs, the tiny Qwen3-MoE, the case's
# loss flags, slime v0.1.0's loss): a launch.sh alone, for doctor on a repro's traceback (`doctor --case harness`).
HARNESS = "harness"


@dataclass(frozen=True)
class Bundled:
    """A launch bundled with nanscope (`doctor --case NAME`): the files in its directory, the environment its
    launch.sh reads."""

    name: str
    files: tuple[str, ...]
    env: MappingProxyType
    release: str | None  # the slime release whose defaults apply; None: the one its launch.sh names


BUNDLED = MappingProxyType({
    NAME: Bundled(NAME, FILES, ENV, RELEASE),
    HARNESS: Bundled(HARNESS, ("launch.sh",), MappingProxyType({}), None),
})  # fmt: skip


@dataclass(frozen=True)
class _Case:
    """The case's files, read and parsed."""

    config: Config
    traceback: Traceback


def root(name: str = NAME):
    """A bundled launch's directory inside the installed package (a Traversable): the case's by default."""
    assert name in BUNDLED, name
    return resources.files("nanscope") / "cases" / name


def harness_script() -> str:
    """The path of the harness's launch.sh in the installed package (a plain install: a file on disk)."""
    return str(root(HARNESS) / "launch.sh")


def text(name: str) -> str:
    """One of the case's files as text."""
    assert name in FILES, name
    return (root() / name).read_text()


@cache  # the case is read once per process: every accessor below reads this one value
def _read() -> _Case:
    with resources.as_file(root() / "launch.sh") as path:
        script = parse_script(path, dict(ENV))
    model = json.loads(text("model.json"))
    config = resolve(script.argv, model, f"model.json (bundled with {NAME})", script.unset, release=RELEASE)
    config.unread = unread(script)  # its model-args file was never shared
    return _Case(config, parse_traceback(text("traceback.txt"), f"{NAME}/traceback.txt"))


def config() -> Config:
    """The case's launch.sh resolved with slime's defaults."""
    return _read().config


def loss_flags() -> dict[str, object]:
    """The loss fields (facts.args.LOSS_FIELDS) that the case's launch.sh sets, as slime resolves them.

    global_batch_size is a batch shape, not a loss flag: callers pass the batch they build.
    """
    cfg = config()
    return {k: cfg[k] for k in LOSS_FIELDS if k != "global_batch_size" and cfg.origin(k) == SCRIPT}


def traceback() -> Traceback:
    """The case's traceback, parsed."""
    return _read().traceback


def frames() -> tuple[tuple[str, int, str], ...]:
    """The traceback's megatron-core frames, outermost first: (file basename, line, function)."""
    return traceback().megatron_frames()


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


def args(**overrides):
    """`facts.args.loss_args` with the case's loss flags (read from its launch.sh), `overrides` applied."""
    return loss_args(**{**loss_flags(), **overrides})


def rollout(vocab_size: int, seed: int = 0, **kwargs) -> Rollout:
    """A rollout group of the case's shape (its temperature and group size): `hazards.case_rollout`."""
    from nanscope import hazards  # heavy: torch; the parent reads the case without building a batch

    return hazards.case_rollout(vocab_size, seed, **hazards.shape(loss_flags()), **kwargs)


def scan_config(**overrides) -> ScanFlags:
    """The flags `nanscope scan` checks a dump against, the case's (its launch.sh over slime's defaults)."""
    a = args()
    values = dict(
        n_samples_per_prompt=a.n_samples_per_prompt, reward_key=None,
        rollout_max_response_len=config()["rollout_max_response_len"],
        advantage_estimator=a.advantage_estimator, rewards_normalization=a.rewards_normalization,
        grpo_std_normalization=a.grpo_std_normalization, use_kl_loss=a.use_kl_loss,
        kl_loss_type=a.kl_loss_type, use_tis=a.use_tis,
    )  # fmt: skip
    return ScanFlags(**{**values, **overrides})
