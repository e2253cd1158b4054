"""The frames of a traceback, each named against the releases nanscope knows: what it does, and whether its
line is that release's.

    frames, ray_ip = parse_frames(lines)   # outermost first; a Ray RayTaskError header is a boundary frame
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nanscope.facts.megatron import MCORE, MEGATRON_LM
from nanscope.facts.releases import SLIME_V0_1_0

RAY = "ray"

_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d{1,18}), in (?P<func>\S+)\s*$')
# a frame whose code (and error) a paste that lost its newlines glued on (launch.error_line)
_SQUASHED = re.compile(
    r'File "(?P<path>[^"]{1,1000})", line (?P<line>\d{1,18}), in (?P<func>\S{1,200}) (?P<code>[^\n]{1,400})'
)
# a frame whose `File "` a paste lost (markdown's bold `**` over it: microsoft/LoRA#186, holdout23 02): the rest of
# CPython's `  File "{filename}", line {lineno}, in {name}` (Lib/traceback.py, StackSummary.format_frame_summary)
_HEADLESS = re.compile(
    r'\s{0,8}[*_`]{0,3}(?P<path>[^\s"*`]{1,1000}\.pyx?)", line (?P<line>\d{1,18}), in (?P<func>[^\s*`]{1,200})[*_`]{0,3}\s*$'
)
_RAY = re.compile(r"RayTaskError\((?P<exc>\w+)\): ray::(?P<call>\S+?\(\)) \((?P<info>[^)]*)\)")
_LM_LOOP = "Megatron-LM's own training loop (pretrain_gpt.py -> megatron.training), which slime never runs: "


@dataclass(frozen=True)
class KnownFrame:
    """A frame nanscope recognises: where it lives and what it does."""

    suffix: str  # path suffix, e.g. "megatron/core/rerun_state_machine.py"
    function: str
    release: str
    line: int | None  # the line in `release`; None: not checked (Ray, versions vary)
    does: str


KNOWN_FRAMES: tuple[KnownFrame, ...] = (
    KnownFrame(
        "train.py", "<module>", SLIME_V0_1_0, 89, "entry point: parses slime's arguments and calls train(args)."
    ),
    KnownFrame(
        "train.py",
        "train",
        SLIME_V0_1_0,
        61,
        "the rollout loop: generate a rollout, then ray.get(actor_model.async_train(...)) blocks until "
        "every actor rank has trained on it; ray.get re-raises the first failed actor's exception here.",
    ),
    KnownFrame(
        "ray/_private/auto_init_hook.py",
        "auto_init_wrapper",
        RAY,
        None,
        "Ray plumbing: initialises Ray if needed and calls through.",
    ),
    KnownFrame(
        "ray/_private/client_mode_hook.py", "wrapper", RAY, None, "Ray plumbing: client-mode dispatch, calls through."
    ),
    KnownFrame("ray/_private/worker.py", "get", RAY, None, "ray.get: waits for the actor tasks' results."),
    KnownFrame(
        "ray/_private/worker.py",
        "get_objects",
        RAY,
        None,
        "a result is an error: re-raised as RayTaskError; the real failure is in the remote actor frames below.",
    ),
    KnownFrame(
        "slime/backends/megatron_utils/actor.py",
        "train",
        SLIME_V0_1_0,
        258,
        "MegatronTrainRayActor.train: turns the rollout into per-rank data (log-probs, advantages), "
        "then calls model.train for this rollout.",
    ),
    KnownFrame(
        "slime/backends/megatron_utils/model.py",
        "train",
        SLIME_V0_1_0,
        431,
        "runs the optimizer steps of this rollout (rollout-batch x n-samples / global-batch), one train_one_step each.",
    ),
    KnownFrame(
        "slime/backends/megatron_utils/model.py",
        "train_one_step",
        SLIME_V0_1_0,
        310,
        "one optimizer step: zero the grads, forward+backward over all micro-batches through "
        "Megatron's pipeline schedule (slime's loss runs on the last stage), then optimizer.step().",
    ),
    KnownFrame(
        "megatron/core/pipeline_parallel/schedules.py",
        "forward_backward_pipelining_without_interleaving",
        MCORE,
        2185,
        "the 1F1B schedule (PP > 1, no virtual stages): warm-up forwards, steady one-forward-one-backward, "
        "cool-down backwards; after this stage's last backward it calls finalize_model_grads.",
    ),
    KnownFrame(
        "megatron/core/pipeline_parallel/schedules.py",
        "forward_backward_pipelining_with_interleaving",
        MCORE,
        1787,
        "the interleaved 1F1B schedule (virtual pipeline stages); after the last backward it calls "
        "finalize_model_grads.",
    ),
    KnownFrame(
        "megatron/core/pipeline_parallel/schedules.py",
        "forward_backward_no_pipelining",
        MCORE,
        641,
        "no pipeline (PP 1): forward+backward of every micro-batch, then finalize_model_grads.",
    ),
    KnownFrame(
        "megatron/core/distributed/finalize_model_grads.py",
        "finalize_model_grads",
        MCORE,
        422,
        "after backward: for each model chunk, finish the data-parallel gradient sync "
        "(then embedding/layernorm all-reduces).",
    ),
    KnownFrame(
        "megatron/core/distributed/distributed_data_parallel.py",
        "finish_grad_sync",
        MCORE,
        588,
        "DDP: for each bucket group, dense parameters first, then expert parameters, finish the "
        "data-parallel gradient reduction.",
    ),
    KnownFrame(
        "megatron/core/distributed/param_and_grad_buffer.py",
        "finish_grad_sync",
        MCORE,
        455,
        "--overlap-grad-reduce is off, so the reduction starts here, synchronously.",
    ),
    KnownFrame(
        "megatron/core/distributed/param_and_grad_buffer.py",
        "start_grad_sync",
        MCORE,
        333,
        "before the reduce-scatter: check_for_nan_in_grad (= --check-for-nan-in-loss-and-grad, on by "
        "default) calls check_grads.",
    ),
    KnownFrame(
        "megatron/core/distributed/param_and_grad_buffer.py",
        "check_grads",
        MCORE,
        185,
        "takes the L2 norm of each bucket's local gradient and validates it: isnan, then isinf.",
    ),
    KnownFrame(
        "megatron/core/rerun_state_machine.py",
        "validate_result",
        MCORE,
        505,
        "rerun mode DISABLED (slime never initialises the rerun state machine): a rejected result "
        "raises RuntimeError at once; nothing is re-run or skipped.",
    ),
    KnownFrame(
        "pretrain_gpt.py",
        "loss_func",
        MEGATRON_LM,
        None,
        _LM_LOOP + "the masked sum of the token losses, checked for NaN (line 251) and Inf (258), "
        "and for a spike under --check-for-spiky-loss (267).",
    ),
    KnownFrame(
        "slime/backends/megatron_utils/actor.py",
        "train_actor",
        "slime v0.2.4 on",
        None,
        "MegatronTrainRayActor.train_actor (slime v0.2.4 on): the actor's part of train, then model.train.",
    ),
    KnownFrame(
        "megatron/core/pipeline_parallel/schedules.py",
        "forward_step",
        MCORE,
        None,
        "one micro-batch's forward pass, then the loss function on the last stage: a failure here is in the "
        "forward pass or the loss, before any gradient.",
    ),
    KnownFrame(
        "megatron/core/pipeline_parallel/schedules.py",
        "backward_step",
        MCORE,
        None,
        "one micro-batch's backward pass (autograd through the model).",
    ),
    KnownFrame(
        "megatron/core/distributed/param_and_grad_buffer.py",
        "check_for_nan_in_grad",
        "megatron-core 0.9 to 0.11",
        None,
        "the bucket group's NaN check before the data-parallel reduce (before check_grads).",
    ),
    KnownFrame(
        "megatron/core/distributed/grad_buffer.py",
        "finish_grad_sync",
        "megatron-core 0.4 to 0.5, and main until 0.6",
        None,
        "a bucket's data-parallel reduce, started here when the reduce does not overlap the backward; on main between "
        "0.5.0 and 0.6.0 its start asserts the bucket's gradient norm is not NaN (renamed param_and_grad_buffer.py).",
    ),
    KnownFrame("megatron/training/training.py", "train_step", MEGATRON_LM, None, _LM_LOOP + "one optimizer step."),
    KnownFrame("megatron/training/training.py", "train", MEGATRON_LM, None, _LM_LOOP + "the iteration loop."),
    KnownFrame("megatron/training/training.py", "pretrain", MEGATRON_LM, None, _LM_LOOP + "its entry point."),
)


@dataclass
class Frame:
    """One `File "...", line N, in f` entry (or the Ray actor boundary)."""

    path: str
    line: int | None
    function: str
    code: str
    known: KnownFrame | None

    @property
    def matches(self) -> bool | None:
        """Whether the line number is the known release's (None: not checked or unknown frame)."""
        if self.known is None or self.known.line is None or self.line is None:
            return None
        return self.line == self.known.line

    @property
    def note(self) -> str:
        if self.path == "<ray actor>":
            return self.code
        if self.known is None:
            return "unknown frame (not from slime v0.1.0, megatron-core 0.15.0rc0, Megatron-LM or Ray): shown as is."
        return self.known.does

    @property
    def release_text(self) -> str:
        if self.known is None:
            return "-"
        if self.matches is None:
            return f"{self.known.release} (line not checked)"
        where = f"{self.known.release} {self.known.suffix.rsplit('/', 1)[-1]}:{self.known.line}"
        return f"matches {where}" if self.matches else f"differs from {where}"


def _known(path: str, function: str) -> KnownFrame | None:
    norm = path.replace("\\", "/")
    for known in KNOWN_FRAMES:
        if known.function == function and (norm == known.suffix or norm.endswith("/" + known.suffix)):
            return known
    return None


def parse_frames(lines: list[str]) -> tuple[list[Frame], str | None]:
    """Frames outermost first; a Ray `RayTaskError` line becomes a boundary pseudo-frame."""
    frames, ray_ip = [], None
    for i, line in enumerate(lines):
        frame = (_FRAME.search(line) or _SQUASHED.search(line, 0, 4096)) if 'File "' in line else None
        if frame is None and '", line ' in line and 'File "' not in line and not (i and _open_head(lines[i - 1])):
            frame = _HEADLESS.match(line[:4096])  # (a head wrapped onto the line before is no lost head)
        if frame:
            code = frame.groupdict().get("code") or ""
            if not code and i + 1 < len(lines) and 'File "' not in lines[i + 1] and '", line ' not in lines[i + 1]:
                code = lines[i + 1].strip().rstrip("*").rstrip()  # a code line never ends in `*`: markdown's bold
                code = "" if set(code) <= {"^", "~", " "} else code
            path, function = frame["path"], frame["func"]
            frames.append(Frame(path, int(frame["line"]), function, code, _known(path, function)))
            continue
        ray = _RAY.search(line)
        if ray:
            ip = re.search(r"ip=([\w.:-]+)", ray["info"])
            ray_ip = ip[1] if ip else None
            frames.append(
                Frame(
                    path="<ray actor>",
                    line=None,
                    function=ray["call"],
                    code=f"Ray actor boundary: the frames below ran inside the actor process "
                    f"{ray['call']} ({ray['info'].split(', actor_id')[0]}); {ray['exc']} is the "
                    f"actor's exception.",
                    known=None,
                )
            )
    return frames, ray_ip


def _open_head(line: str) -> bool:
    """`line` ends inside a frame's `File "...`: a terminal wrapped the path onto the next line."""
    at = line.rfind('File "')
    return at >= 0 and '"' not in line[at + 6 :]


_GLUED = re.compile(r'\)\s{2,40}[A-Za-z_][\w.]{0,80}\(|\)(?:self|File)\b|\S\s{1,40}File "')


def interleaved(lines: list[str]) -> bool:
    """The frames of several processes interleave in `lines`: a line holds two statements or a statement and a frame
    glued mid-line (`self.step(x)    self.engine.step()`), as when ranks write one stream at once."""
    return any(_GLUED.search(line, 0, 4096) is not None for line in lines if "(" in line)


def unique(frames: list[Frame]) -> list[Frame]:
    """Each frame once, where it was first read (interleaved ranks print the same frames several times)."""
    out: list[Frame] = []
    for frame in frames:  # the same file and line, its function's name whole or cut (`backwar`): the same frame
        same = (f for f in out if (f.path, f.line) == (frame.path, frame.line))
        if not any(f.function.startswith(frame.function) or frame.function.startswith(f.function) for f in same):
            out.append(frame)
    return out
