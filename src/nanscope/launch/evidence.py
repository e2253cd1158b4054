"""What a traceback's frames show, also without its error line: the pipeline schedule, the check reached, the
phase of the step, and the framework that ran it (with its release, for slime, when the lines name one).

    forward_backward_no_pipelining                   PP 1
    forward_backward_pipelining_without_interleaving 1F1B: PP > 1, no virtual stages
    forward_backward_pipelining_with_interleaving    interleaved 1F1B: PP > 1 with virtual stages (VPP)
    finalize_model_grads -> ... -> check_grads       the DDP bucket check, after the last backward
    loss_func                                        Megatron-LM's forward-loss check
    clip_grad_norm_fp32                              clip_grads' check (core 0.4, 0.5)

    evidence = read_frames(frames, lines)            # lines: the traceback's text, for the log-line markers
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from nanscope.facts import frameworks, releases, slime_frames, wordings
from nanscope.launch.frames import Frame

# schedule function -> (schedule, PP, VPP, in words)
SCHEDULES = {
    "forward_backward_no_pipelining": ("no-pipelining", "1", False, "no pipeline: PP 1"),
    "forward_backward_pipelining_without_interleaving": ("1f1b", ">1", False, "1F1B: PP > 1, no virtual stages"),
    "forward_backward_pipelining_with_interleaving": (
        "interleaved",
        ">1",
        True,
        "interleaved 1F1B: PP > 1 with virtual pipeline stages (VPP)",
    ),
}
# function -> (the check it leads to, the phase of the step), innermost wins
CHECK_FRAMES = {
    "forward_step": (None, "forward"),
    "backward_step": (None, "backward"),
    "loss_func": ("loss", "forward"),
    "finalize_model_grads": ("bucket", "gradient check"),
    "finish_grad_sync": ("bucket", "gradient check"),
    "start_grad_sync": ("bucket", "gradient check"),
    "check_for_nan_in_grad": ("bucket", "gradient check"),
    "check_grads": ("bucket", "gradient check"),
    "clip_grad_norm_fp32": ("clip-grads", "optimizer step"),
    "get_grad_norm_fp32": (None, "optimizer step"),
    "step": (None, "optimizer step"),
}
CHECKS_IN_WORDS = {
    "bucket": "the DDP bucket check (finalize_model_grads -> finish_grad_sync -> check_grads): each bucket's local "
    "gradient norm, after the last micro-batch's backward, before the data-parallel reduce",
    "loss": "Megatron-LM's forward-loss check (loss_func), on the last stage, after each micro-batch's forward",
    "clip-grads": "clip_grads' check of the local gradient norm, in the optimizer step (Megatron-LM core 0.4, 0.5)",
}


@dataclass(frozen=True)
class Framework:
    """The framework a report comes from (facts.frameworks.NAMES), its release where known, and the evidence."""

    name: str
    release: str | None
    how: str
    stack: str | None = None  # a stack nanscope does not catalogue, named by its own lines (frameworks.TOKEN_FREE)

    def to_dict(self) -> dict:
        return {"name": self.name, "release": self.release, "how": self.how, "stack": self.stack}


UNKNOWN = Framework(frameworks.UNKNOWN, None, "nothing in the input names a framework nanscope catalogues")
UNCATALOGUED = "no framework nanscope catalogues"  # the libraries the input shows follow (launch.libraries)


@dataclass
class FrameEvidence:
    """What the frames show (each None when they do not show it).

    Attributes:
        schedule: "no-pipelining", "1f1b" or "interleaved".
        pp: "1" or ">1" (from the schedule).
        vpp: virtual pipeline stages (from the schedule).
        check: the check reached: "bucket", "loss" or "clip-grads".
        phase: "forward", "backward", "gradient check" or "optimizer step" (the innermost frame that shows one).
        log_prob_pass: the step is a forward-only pass (a log-prob computation), not a training step.
        lines: the evidence, one sentence each.
    """

    schedule: str | None = None
    pp: str | None = None
    vpp: bool | None = None
    check: str | None = None
    phase: str | None = None
    log_prob_pass: bool = False
    lines: list[str] = field(default_factory=list)
    core_releases: tuple[str, ...] | None = None  # the megatron-core releases the frames' lines fit
    overlap_off: str | None = None  # a frame that runs only where the data-parallel reduce is not overlapped

    def to_dict(self) -> dict:
        return {
            "schedule": self.schedule,
            "pp": self.pp,
            "vpp": self.vpp,
            "check": self.check,
            "phase": self.phase,
            "log_prob_pass": self.log_prob_pass,
            "megatron_core": None if self.core_releases is None else list(self.core_releases),
            "lines": list(self.lines),
        }


def read_frames(frames: list[Frame]) -> FrameEvidence:
    """The schedule, the check reached and the phase the frames show."""
    evidence = FrameEvidence()
    for frame in frames:
        if frame.function in SCHEDULES:
            schedule, pp, vpp, words = SCHEDULES[frame.function]
            evidence.schedule, evidence.pp, evidence.vpp = schedule, pp, vpp
            evidence.lines.append(f"{frame.function} (line {frame.line}): {words}")
        if frame.function in CHECK_FRAMES and _core_or_lm(frame):
            check, phase = CHECK_FRAMES[frame.function]
            evidence.check = check or evidence.check
            evidence.phase = phase
        if frame.function in ("compute_log_prob", "forward_only", "compute_ref_log_prob"):
            evidence.log_prob_pass = True
    if evidence.check is not None:
        evidence.lines.append(f"the check reached: {CHECKS_IN_WORDS[evidence.check]}")
    if evidence.phase is not None and evidence.check is None:
        evidence.lines.append(f"the innermost step frame is the {evidence.phase}: no check was reached yet")
    if evidence.log_prob_pass:
        evidence.lines.append("a forward-only pass (log-probs), not a training step: no gradient was computed")
    core = core_releases(frames)
    if core is not None:
        evidence.core_releases, shown = core
        fits = _range(evidence.core_releases) or "no release nanscope knows"
        if _grad_buffer(frames):
            fits += " (or a Megatron-LM main before 0.6.0, which renamed grad_buffer.py param_and_grad_buffer.py)"
        evidence.lines.append(f"megatron-core {fits}: the lines of {', '.join(shown)}")
    return evidence


def _grad_buffer(frames: list[Frame]) -> bool:
    """A frame of core 0.4 and 0.5's DDP buffer file (facts.wordings.GRAD_BUFFER)."""
    return any(frame.path.replace("\\", "/").endswith(wordings.GRAD_BUFFER) for frame in frames)


def unreleased(failure, evidence: FrameEvidence, frames: list[Frame]) -> None:
    """Megatron's grad-norm assertion (launch.failure.Failure, form assert) through a frame of grad_buffer.py: printed
    by a Megatron-LM main of a window no release has (facts.wordings.GRAD_BUFFER), not by core 0.6 to 0.9."""
    if failure is None or failure.format != "assert" or failure.check is None or failure.check.id != "grad-norm-nan":
        return
    if not _grad_buffer(frames):
        return
    failure.releases, failure.unreleased, evidence.core_releases = (), wordings.GRAD_BUFFER_MAIN, ()
    evidence.lines = [line for line in evidence.lines if not line.startswith(("megatron-core ", "the check reached"))]
    evidence.lines.append("the check reached: grad_buffer.py's DDP bucket check (finish_grad_sync): each bucket's local "
                          "gradient norm asserted finite before the data-parallel reduce")  # fmt: skip
    evidence.lines.append(
        f"megatron-core: {wordings.GRAD_BUFFER_MAIN}: the frame of grad_buffer.py, under the "
        "grad-norm assertion it had there"
    )
    sync = next((frame for frame in frames if frame.path.replace("\\", "/").endswith(wordings.GRAD_BUFFER)
                 and frame.function == "finish_grad_sync" and frame.line in wordings.GRAD_BUFFER_SYNC), None)  # fmt: skip
    if sync is not None:
        evidence.overlap_off = (f"the frame grad_buffer.py:{sync.line} finish_grad_sync is its call of start_grad_sync "
                                f"under `if not self.overlap_grad_reduce:` ({wordings.GRAD_BUFFER_SYNC_SOURCE}): the "
                                "data-parallel reduce ran after the backward, not overlapped with it")  # fmt: skip


def _range(found: tuple[str, ...]) -> str:
    """`0.12.0 .. 0.15.0` (or one release); '' for none."""
    if not found:
        return ""
    return found[0] if len(found) == 1 else f"{found[0]} .. {found[-1]}"


def core_releases(frames: list[Frame]) -> tuple[tuple[str, ...], list[str]] | None:
    """(the megatron-core releases every frame of facts.wordings.FRAME_LINES fits, those frames); None: none such."""
    have, shown = set(wordings.RELEASES), []
    for frame in frames:
        path = frame.path.replace("\\", "/")
        if path.endswith(wordings.GRAD_BUFFER):  # the file of 0.4.0 and 0.5.0 (and of main until 0.6.0)
            have &= {"0.4.0", "0.5.0"}
            shown.append(f"grad_buffer.py:{frame.line} {frame.function}")
        for suffix, function in wordings.FRAME_LINES:
            if function == frame.function and frame.line is not None and path.endswith(suffix):
                have &= wordings.frame_releases(suffix, function, frame.line)
                shown.append(f"{suffix.rsplit('/', 1)[-1]}:{frame.line} {function}")
    if not shown:
        return None
    return tuple(release for release in wordings.RELEASES if release in have), shown


def _core_or_lm(frame: Frame) -> bool:
    path = frame.path.replace("\\", "/")
    return frameworks.CORE in path or path.endswith(("pretrain_gpt.py", "pretrain_mamba.py", "clip_grads.py"))


def framework_of(
    frames: list[Frame], lines: list[str], keys: set[str] | frozenset[str] = frozenset(), code: list = ()
) -> Framework:
    """The framework the frames' paths, the traceback's log lines, the metric lines' keys (`keys`, lowered) and the
    known code lines (`code`: launch.code_lines hits; a shared text names none) name (facts.frameworks), each
    framework's evidence the strongest of these, in that order; slime's release from its frames' lines; UNKNOWN when
    nothing names one."""
    found: dict[str, str] = {}
    for frame in frames:
        path = "/" + frame.path.replace("\\", "/").lstrip("/")
        for name, dirs in frameworks.PATHS.items():
            hit = next((directory for directory in dirs if directory in path), None)
            if hit is not None:
                found.setdefault(name, _path_how(hit, frame))
    for line in lines:
        for name, (pattern, why) in frameworks.PATTERNS.items():
            if (said := pattern.search(line.strip()[:200])) is not None:
                found.setdefault(name, f"its line `{said.group().strip()}` is {why}")
        for name, texts in frameworks.TEXTS.items():
            hit = next((text for text in texts if text in line), None)
            if hit is not None:
                found.setdefault(name, f"the log names it: `{hit.strip().strip('([|:]= ').strip()}`")
    for name, sets in frameworks.KEYS.items():
        hit = next((wanted for wanted in sets if wanted <= keys), None)
        if hit is not None:
            shape = ", printed as a Python dict" if frameworks.PY_DICT in hit else ""
            found.setdefault(name, f"its metric lines' keys ({', '.join(sorted(hit - {frameworks.PY_DICT}))}){shape}")
    for hit in code:
        if not hit.code.shared:
            found.setdefault(
                hit.code.stack, f"its code line `{hit.code.text}` is {hit.code.library}'s ({hit.code.where})"
            )
    name = next((name for name in frameworks.NAMES if name in found), None)
    if name is None:
        return UNKNOWN
    if name == frameworks.MEGATRON_LM and (engine := _deepspeed_engine(frames, lines)) is not None:
        how = f"{found[name]}, Megatron-LM's, beside DeepSpeed's engine ({engine}), which Megatron-LM's own training "
        how += "loop never runs"
        return Framework(frameworks.MEGATRON_DEEPSPEED, None, how)
    how = found[name]
    # NeMo 0.x's frames and log prefix are NeMo's too: one package, not a library it calls
    others = [other for other in frameworks.NAMES if other in found and other != name
              and not (name == frameworks.NEMO_0 and other == frameworks.NEMO)]  # fmt: skip
    if others:
        how += f"; it calls {', '.join(others)}"
    if name != frameworks.SLIME:
        return Framework(name, *_printed_release(name, lines, how))
    release, why = slime_release(frames)
    return Framework(name, release, f"{how}; {why}")


def _printed_release(name: str, lines: list[str], how: str) -> tuple[str | None, str]:
    """The release a framework's own line prints (facts.frameworks.PRINTED_RELEASES), and `how` with that line said."""
    pattern = frameworks.PRINTED_RELEASES.get(name)
    for line in lines if pattern is not None else ():
        if (match := pattern.search(line[:300])) is not None:
            return match["release"], f"{how}; its banner prints `{match.group().split(None, 1)[1]}`"
    return None, how


def _path_how(hit: str, frame: Frame) -> str:
    """How a frame's path names its framework: a directory of its package, or a file only it has (with what the file
    is, where facts.frameworks.FILES says)."""
    if not hit.endswith(".py"):
        return f"frames under {hit.strip('/')}/ ({_short(frame)})"
    what = frameworks.FILES.get(hit)
    return f"a frame in {hit.strip('/')} ({_short(frame)})" + (f": {what}" if what else "")


_DEEPSPEED_LOGGER = re.compile(r"\] \[(?P<file>\w{1,60}\.py):\d{1,6}:\w{1,60}\]")  # `[INFO] [engine.py:1234:step]`


def _deepspeed_engine(frames: list[Frame], lines: list[str]) -> str | None:
    """What shows DeepSpeed's engine at work (facts.frameworks.DEEPSPEED_ENGINE_FILES): its frames, its logger's
    lines; None: nothing."""
    for frame in frames:
        if frameworks.DEEPSPEED_ENGINE_PATH in "/" + frame.path.replace("\\", "/").lstrip("/"):
            return f"frames under deepspeed/runtime/ ({_short(frame)})"
    for line in lines:
        logger = _DEEPSPEED_LOGGER.search(line) if "] [" in line else None
        if logger is not None and logger["file"] in frameworks.DEEPSPEED_ENGINE_FILES:
            return f"its logger's lines, `{logger[0][2:]}`"
    return None


def _short(frame: Frame) -> str:
    return f"{frame.path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.line} {frame.function}"


def slime_release(frames: list[Frame]) -> tuple[str | None, str]:
    """(the slime release whose lines every slime package frame is on, the evidence); (None, why) otherwise."""
    package = [
        (suffix, frame)
        for frame in frames
        for suffix, function in slime_frames.FRAMES
        if function == frame.function and frame.line is not None and _under(frame.path, suffix)
        and slime_frames.PACKAGE in "/" + frame.path.replace("\\", "/")
    ]  # fmt: skip
    if not package:
        return None, "no frame of slime's package names a release: release unknown"
    shown = ", ".join(_short(frame) for _, frame in package)
    fitting = [
        key
        for key in releases.KEYS
        if all(slime_frames.fits(suffix, frame.function, frame.line, key) for suffix, frame in package)
    ]
    if len(fitting) == 1:
        return fitting[0], f"its frames {shown} are slime {fitting[0]}'s lines"
    expected = "; ".join(
        f"{key}: " + ", ".join(_expected(suffix, frame.function, key) for suffix, frame in package)
        for key in releases.KEYS
    )
    return None, f"its frames {shown} are no release nanscope knows ({expected}): release unknown"


def _under(path: str, suffix: str) -> bool:
    norm = path.replace("\\", "/")
    return norm == suffix or norm.endswith("/" + suffix)


def _expected(suffix: str, function: str, key: str) -> str:
    lines = slime_frames.lines_at(suffix, function, key)
    name = suffix.rsplit("/", 1)[-1]
    return f"{name} {function} at " + "/".join(str(first) for first, _ in lines) if lines else f"no {name} {function}"


def _slime_known(frame: Frame) -> bool:
    known = frame.known
    return known is not None and known.release.startswith("slime") and "/slime/" not in frame.path.replace("\\", "/")


def _beside_slime(frames: list[Frame]) -> bool:
    """Some frame besides a `train.py` named like slime's is slime's, Ray's or Megatron's (slime's driver runs
    train.py -> ray.get -> the actor's slime and megatron frames)."""
    return any(
        frame.path == "<ray actor>"
        or "/slime/" in frame.path.replace("\\", "/")
        or (frame.known is not None and not frame.known.release.startswith("slime"))
        for frame in frames
    )


def annotate(frames: list[Frame], framework: Framework) -> list[Frame]:
    """The frames, slime's checked against the release the framework's evidence names (KNOWN_FRAMES are v0.1.0's);
    in another framework's job, or where no framework is named and nothing beside it is slime's, Ray's or
    Megatron's, a frame named like slime's (`train.py <module>`) is not slime's."""
    alone = framework.name == frameworks.UNKNOWN and not _beside_slime(frames)
    if framework.name not in (frameworks.SLIME, frameworks.UNKNOWN) or alone:
        return [replace(frame, known=None) if _slime_known(frame) else frame for frame in frames]
    if framework.name != frameworks.SLIME or framework.release == releases.V0_1_0:
        return frames
    out = []
    for frame in frames:
        known = frame.known
        if known is not None and known.release.startswith("slime") and frame.line is not None:
            if framework.release is None:
                out.append(replace(frame, known=replace(known, release="slime (release unknown)", line=None)))
                continue
            lines = slime_frames.lines_at(known.suffix, frame.function, framework.release)
            line = next((first for first, last in lines if first <= frame.line <= last), lines[0][0] if lines else None)
            frame = replace(frame, known=replace(known, release=f"slime {framework.release}", line=line))
        out.append(frame)
    return out


def wrapped_framework(wrapped: tuple[str, ...]) -> Framework | None:
    """The framework a wrapper's target names by its file name (facts.frameworks.WRAPPED_SCRIPTS; `wrapped`: each
    target as `name (line N)`); None: none does."""
    for target in wrapped:
        name = target.split(" (line ", 1)[0].rsplit("/", 1)[-1]
        for framework, (pattern, where) in frameworks.WRAPPED_SCRIPTS.items():
            if re.fullmatch(pattern, name):
                return Framework(framework, None, f"the launch script runs {name}, the name of {where}")
    return None


def with_core(framework: Framework, core: str | None) -> Framework:
    """An unknown framework whose job megatron-core runs (`core`: the evidence, launch.core_evidence): said so."""
    if framework.name != frameworks.UNKNOWN or core is None:
        return framework
    return Framework(frameworks.UNKNOWN, None, f"nothing names the job's framework; megatron-core runs it: {core}")
