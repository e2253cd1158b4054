"""`nanscope repro --slime-src DIR`: the case through slime's own train.py on CPU, checked against the case.

    rep = slime_repro.run(sources, hazard="nan-rollout-logprob", plugin=False)
    rep.as_is.frames.ok      # the case's slime and megatron-core frames, in the case's order, and no others

The run itself is `nanscope.slime_train.run`. This module reads the bundled case (its launch flags, its traceback)
at the top and checks what the run gave:

- as-is: train.py died with megatron-core's NaN check, the message the case's (`Unexpected result nan`, the
  bucket check), raised on a rank that saw the NaN (its own message, as Ray shows the first failed actor), and the
  driver's traceback holds exactly the case's slime and megatron-core frames (file, line, function), in the case's
  order. Frames are compared by their path from `slime/` or `megatron/` (train.py by name); Ray's frames and
  nanscope's are not compared (Ray's differ with its version; nanscope adds none to a driver's traceback).
- --plugin: the `sentinel` launch (README lines 2 and 3, skip mode) detects the step, reruns it (the verdict),
  writes the report and its bundle, skips the step and exits 0; the bundles replayed offline name the op, the
  sample and the token (as `nanscope trace REPORT_DIR` does); the `plugin` launch (all three lines) trains through
  with a finite loss and non-zero nan_guard/* counters; both leave W&B offline runs with the nanscope/* series.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nanscope import case
from nanscope.causes import catalogue
from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.facts.paths import BUNDLE_SUFFIX, REPORT_FILE
from nanscope.inputs import MiB, directory_files, read_json
from nanscope.launch.frames import parse_frames
from nanscope.launch.tracebacks import parse_traceback
from nanscope.slime_train import run as slime_run
from nanscope.slime_train.prepare import IN_DATA

Frame = tuple[str, int, str]
REPORT_LIMIT = 16 * MiB  # a report the plugin writes is a few kB
DEFAULT_HAZARD = catalogue.NAN_ROLLOUT_LOGPROB.name  # the case's custom generate function and --use-tis: data


def normalised(path: str) -> str | None:
    """A frame's path as compared: from `slime/` or `megatron/` on, `train.py` by name; None for other files."""
    if path.endswith("/train.py") or path == "train.py":
        return "train.py"
    match = re.match(r"^(?:.*/)?((?:slime|megatron)/.*)$", path)  # the last slime/ or megatron/: a checkout's own
    return match[1] if match else None


def compared_frames(text: str) -> list[Frame]:
    """The slime, train.py and megatron frames of a traceback, outermost first, paths `normalised`."""
    frames, _ = parse_frames(text.splitlines())
    return [(p, f.line, f.function) for f in frames if (p := normalised(f.path)) is not None]


@dataclass
class FrameDiff:
    case: list[Frame]
    run: list[Frame]

    @property
    def missing(self) -> list[Frame]:
        return [f for f in self.case if f not in self.run]

    @property
    def extra(self) -> list[Frame]:
        return [f for f in self.run if f not in self.case]

    @property
    def ok(self) -> bool:
        """The run's compared frames are the case's, in the case's order."""
        return self.run == self.case

    @property
    def megatron_ok(self) -> bool:
        """train.py on top and the case's megatron-core frames, in order (a release other than the case's has slime
        lines of its own)."""
        core = [f for f in self.case if f[0].startswith("megatron/")]
        on_top = bool(self.run) and self.run[0][0] == "train.py"
        return on_top and [f for f in self.run if f[0].startswith("megatron/")] == core


@dataclass
class AsIsCheck:
    launch: slime_run.LaunchResult
    frames: FrameDiff | None
    message: str | None  # megatron's message without the "Rank R, node N, device D, iteration I: " prefix
    rank: int | None  # the rank whose error Ray shows first
    case_release: bool = True  # the checkout is the release the case ran: its slime frames must be the case's too

    @property
    def ok(self) -> bool:
        frames = self.frames is not None and (self.frames.ok if self.case_release else self.frames.megatron_ok)
        return self.launch.returncode not in (0, None) and frames and self.message == case.nan_check_message()


@dataclass
class PluginCheck:
    sentinel: slime_run.LaunchResult
    plugin: slime_run.LaunchResult
    reports: list[dict]  # the sentinel launch's report JSONs
    bundles: list[str]
    replay: dict | None  # the bundles replayed offline, through the checkout's loss
    wandb_runs: list[str]  # the offline W&B run files

    @property
    def verdicts(self) -> list[str]:
        return sorted({r["rerun"]["verdict"] for r in self.reports if r.get("rerun")})

    @property
    def loss_finite(self) -> bool:
        steps = self.plugin.steps
        return bool(steps) and all(math.isfinite(v) for s in steps for k, v in s.items() if k.startswith("train/"))

    @property
    def nan_guard(self) -> dict[str, float]:
        """The NaN-safe loss's non-zero counters: the hook's line of each step (nanscope/nan_guard/*, with the hook
        installed), or slime's own train/nan_guard/* (the loss alone)."""
        prefixes = ("train/nan_guard/", "nanscope/nan_guard/")
        return {k: v for s in self.plugin.steps for k, v in s.items() if k.startswith(prefixes) and v}

    @property
    def ok(self) -> bool:
        return (
            self.sentinel.returncode == 0
            and self.plugin.returncode == 0
            and bool(self.reports)
            and bool(self.bundles)
            and bool(self.verdicts)
            and self.replay is not None
            and self.replay["found"]
            and self.loss_finite
            and bool(self.nan_guard)
            and len(self.wandb_runs) >= 2
        )


@dataclass
class SlimeRepro:
    result: slime_run.Result
    sources: slime_run.Sources
    hazard: str
    as_is: AsIsCheck | None = None
    plugin: PluginCheck | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        if self.result.error or self.result.timed_out:
            return False
        return (self.as_is is None or self.as_is.ok) and (self.plugin is None or self.plugin.ok)


def release_of(checkout: Path) -> str:
    """The release a checkout holds, by its Sample's fields (slime/utils/types.py); v0.3.1 and main share them."""
    fields = slime_run.sample_fields(checkout)
    matches = [r.key for r in releases.RELEASES if tuple(r.sample_fields) == fields]
    return matches[0] if matches else ""


def run(
    sources: slime_run.Sources,
    *,
    hazard: str = DEFAULT_HAZARD,
    plugin: bool = False,
    report_dir: str | None = None,
    seed: int = 0,
    timeout_s: float = 1800.0,
    progress: Callable[[str], None] | None = None,
) -> SlimeRepro:
    """slime's train.py from `sources`, as-is or with the plugin (`report_dir` its reports, dumps and W&B runs);
    `progress(line)` at each phase."""
    assert hazard in IN_DATA, hazard
    release = release_of(sources.slime)
    request = slime_run.Request(
        sources=sources, case_flags=case.config().given, hazard=hazard, temperature=case.temperature(),
        group_size=case.group_size(), release=release or releases.V0_1_0,
        launches=(slime_run.SENTINEL, slime_run.PLUGIN) if plugin else (slime_run.AS_IS,),
        report_dir=report_dir if plugin else None, seed=seed, timeout_s=timeout_s,
    )  # fmt: skip
    result = slime_run.run(request, progress)
    rep = SlimeRepro(result=result, sources=sources, hazard=hazard)
    rep.notes += [f"not left in the report directory: {why}" for why in result.left_out]
    if not release:
        rep.notes.append(f"{sources.slime}: a slime release nanscope does not know (its Sample fields); run as v0.1.0")
    done = {launch.name: launch for launch in result.launches}
    if "as-is" in done:
        rep.as_is = _as_is(done["as-is"])
        rep.as_is.case_release = release == case.RELEASE
        if not rep.as_is.case_release:
            rep.notes.append(
                f"slime {release or '?'} is not the case's release ({case.RELEASE}): its slime frames are its own lines; "
                "the check is the message and megatron-core's frames"
            )
    if plugin and "sentinel" in done and "plugin" in done:
        rep.plugin = _plugin(done["sentinel"], done["plugin"], report_dir, sources.slime)
    return rep


def _as_is(launch: slime_run.LaunchResult) -> AsIsCheck:
    if launch.traceback is None:
        return AsIsCheck(launch, None, None, None)
    diff = FrameDiff(case=compared_frames(case.text("traceback.txt")), run=compared_frames(launch.traceback))
    try:
        failure = parse_traceback(launch.traceback, "the driver's traceback").failure
    except UserError:  # nothing nanscope reads in it
        failure = None
    if failure is None:  # train.py died of something else (its frames may still run through megatron-core)
        return AsIsCheck(launch, diff, None, None)
    return AsIsCheck(launch, diff, f"Unexpected result {failure.result} (message='{failure.message}')", failure.rank)


def _plugin(sentinel, plugin, report_dir: str | None, checkout: Path) -> PluginCheck:
    from nanscope.trace.bundles import bundle_step  # heavy: torch, for the offline replay only

    root = Path(report_dir) if report_dir else None
    found, _ = directory_files(root, "*") if root is not None and root.is_dir() else ([], [])
    ours = [path for path in found if REPORT_FILE.fullmatch(path.name)]  # regular files only: a FIFO never blocks
    reports = []
    for path in (p for p in ours if p.name.endswith(".json") and not p.name.endswith(".trace.json")):
        with contextlib.suppress(UserError):  # another run's file, half a file: not this run's report
            reports.append(read_json(path, "report", REPORT_LIMIT))
    reports = [doc for doc in reports if isinstance(doc, dict) and "replay" in doc]
    bundles = [str(p) for p in ours if p.name.endswith(BUNDLE_SUFFIX)]
    replay = bundle_step.replay_step([Path(b) for b in bundles], slime_src=checkout) if bundles else None
    runs = sorted(str(p) for p in root.glob("wandb/wandb/offline-run-*/run-*.wandb")) if root is not None else []
    return PluginCheck(sentinel, plugin, reports=reports, bundles=bundles, replay=replay, wandb_runs=runs)
