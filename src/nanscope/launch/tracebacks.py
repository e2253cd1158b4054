"""Reading a slime/Megatron NaN traceback: the failing rank, the message, and what each frame does.

The error comes from megatron-core's `RerunStateMachine.validate_result` in mode DISABLED:
`Rank {rank}, node {host}, device {cuda device}, iteration {i}: Unexpected result {r} (message='...')`.
It is found anywhere in the text (bare, after `RuntimeError:`, or inside a Ray `RayTaskError`), also
when the text is cut short before the closing `')` (the failure is then marked truncated). Reading is
linear in the length of the text.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from nanscope.errors import UserError
from nanscope.facts.megatron import MCORE, core_frame
from nanscope.facts.releases import SLIME_V0_1_0

RAY = "ray"

# The error line, read in two steps so that reading stays linear in the text's length (one regex with
# lazy groups for the result and the message is cubic on a long line of repeated prefixes):
# `Rank R, node H, device D, iteration I: ` by this regex, the rest by fixed markers.
_PREFIX = re.compile(
    r"Rank (?P<rank>\d+), node (?P<node>[^\s,]+), device (?P<device>\d+), "
    r"iteration (?P<iteration>-?\d+): "
)
_RESULT = "Unexpected result "
_MESSAGE = " (message='"
_END = "')"
_MAX_DIGITS = 18  # a number with more digits is not a rank, device, iteration or line Megatron prints
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d{1,18}), in (?P<func>\S+)\s*$')
_RAY = re.compile(r"RayTaskError\((?P<exc>\w+)\): ray::(?P<call>\S+?\(\)) \((?P<info>[^)]*)\)")


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
            return "unknown frame (not from slime v0.1.0, megatron-core 0.15.0rc0 or Ray): shown as is."
        return self.known.does

    @property
    def release_text(self) -> str:
        if self.known is None:
            return "-"
        if self.matches is None:
            return f"{self.known.release} (line not checked)"
        where = f"{self.known.release} {self.known.suffix.rsplit('/', 1)[-1]}:{self.known.line}"
        return f"matches {where}" if self.matches else f"differs from {where}"


@dataclass
class Failure:
    """The Megatron error line."""

    rank: int
    node: str
    device: int
    iteration: int
    result: str
    kind: str  # "NaN" | "Inf"
    message: str
    bucket: int | None
    text: str
    truncated: bool = False  # the line ends before its closing `')`: message (or result) kept as far as it goes
    line: int = 0  # 1-based line of the text


@dataclass
class Traceback:
    """A parsed traceback: the failure and the frames, outermost first."""

    failure: Failure
    frames: list[Frame]
    ray_ip: str | None = None
    other_ranks: list[int] = field(default_factory=list)  # later Megatron errors in the same text

    def megatron_frames(self) -> tuple[tuple[str, int, str], ...]:
        """The frames inside megatron-core, outermost first: (file basename, line, function)."""
        found = (core_frame(frame.path, frame.line, frame.function) for frame in self.frames)
        return tuple(frame for frame in found if frame is not None)


def _known(path: str, function: str) -> KnownFrame | None:
    norm = path.replace("\\", "/")
    for known in KNOWN_FRAMES:
        if known.function == function and (norm == known.suffix or norm.endswith("/" + known.suffix)):
            return known
    return None


def failures(text: str, origin: str = "traceback") -> Iterator[Failure]:
    """Every Megatron error line in `text`, in order; one cut short before its `')` is marked truncated.

    Raises:
        UserError: a rank, device or iteration with more digits than any Megatron prints.
    """
    for number, line in enumerate(text.split("\n"), 1):
        if "Rank " in line:
            yield from _line_failures(line, number, origin)


def _line_failures(line: str, number: int, origin: str) -> Iterator[Failure]:
    """Errors on one line, left to right, without overlap; each marker position is looked up, not rescanned."""
    messages = [marker.start() for marker in re.finditer(re.escape(_MESSAGE), line)]
    ends = [marker.start() for marker in re.finditer(re.escape(_END), line)]
    pos = 0
    while (prefix := _PREFIX.search(line, pos)) is not None:
        start = prefix.end()
        if not line.startswith(_RESULT, start) and not (
            len(line) - start < len(_RESULT) and _RESULT.startswith(line[start:])
        ):
            pos = start  # the same prefix on another kind of Megatron log line
            continue
        result_at = start + len(_RESULT)
        result_end = _next(messages, result_at + 1)  # the result has at least one character
        if result_end is None:
            result, message, end, truncated = line[result_at:].strip(), "", len(line), True
        else:
            message_at = result_end + len(_MESSAGE)
            message_end = _next(ends, message_at)
            truncated = message_end is None
            end = len(line) if truncated else message_end + len(_END)
            result, message = line[result_at:result_end], line[message_at:message_end]
        yield _failure(
            prefix,
            result=result,
            message=message,
            text=line[prefix.start() : end],
            truncated=truncated,
            number=number,
            origin=origin,
        )
        pos = end


def _next(positions: list[int], at: int) -> int | None:
    """The first position >= `at`, or None."""
    i = bisect.bisect_left(positions, at)
    return positions[i] if i < len(positions) else None


def _failure(
    prefix: re.Match, *, result: str, message: str, text: str, truncated: bool, number: int, origin: str
) -> Failure:
    """The failure whose `Rank R, node H, device D, iteration I: ` is `prefix`, on line `number`."""
    for name in ("rank", "device", "iteration"):
        if len(prefix[name].lstrip("-")) > _MAX_DIGITS:
            raise UserError(
                f"{origin}: line {number}: the {name} has {len(prefix[name].lstrip('-'))} digits, "
                "more than Megatron ever prints: not a Megatron error line"
            )
    low = (result + " " + message).lower()
    kind = "NaN" if "nan" in low else "Inf" if "inf" in low else "?"
    bucket = re.search(r"bucket #(\d{1,18})\b", message)
    return Failure(
        rank=int(prefix["rank"]),
        node=prefix["node"],
        device=int(prefix["device"]),
        iteration=int(prefix["iteration"]),
        result=result,
        kind=kind,
        message=message,
        bucket=int(bucket[1]) if bucket else None,
        text=text,
        truncated=truncated,
        line=number,
    )


def parse_frames(text: str) -> tuple[list[Frame], str | None]:
    """Frames outermost first; a Ray `RayTaskError` line becomes a boundary pseudo-frame."""
    lines = text.splitlines()
    frames, ray_ip = [], None
    for i, line in enumerate(lines):
        frame = _FRAME.match(line)
        if frame:
            code = ""
            if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]):
                code = lines[i + 1].strip()
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


def parse_traceback(text: str, origin: str = "traceback") -> Traceback:
    """Parse a traceback text.

    Raises:
        UserError: no Megatron `Rank N, ... Unexpected result` error in it.
    """
    found = failures(text, origin)
    failure = next(found, None)
    if failure is None:
        raise UserError(
            f'{origin}: no Megatron error found (expected a line like "Rank 50, node dgx172, '
            f"device 2, iteration -1: Unexpected result nan (message='...')\")"
        )
    frames, ip = parse_frames(text)
    others = sorted({later.rank for later in found} - {failure.rank})
    return Traceback(failure, frames, ip, others)


def explain_iteration(iteration: int) -> str:
    if iteration == -1:
        return (
            "iteration -1: Megatron's RerunStateMachine starts its counter at -1 and only its own "
            "training loop advances it (should_run_forward_backward); slime v0.1.0 drives "
            "train_one_step itself and never does, so it is always -1: not a rollout or step index."
        )
    return (
        f"iteration {iteration}: the RerunStateMachine's counter (advanced by Megatron's training loop, "
        "not by slime v0.1.0)."
    )


def explain_bucket(bucket: int | None, pp_rank: int | None, overlap_grad_reduce: bool = False) -> str:
    if bucket is None:
        return ""
    if bucket > 0:
        return (
            f"bucket #{bucket}: a bucket group with several buckets (fp8 parameters, or a forced single "
            "bucket group); the index counts buckets in that group and names no layer."
        )
    if pp_rank:
        scope = "on a PP stage > 0 Megatron turns bucketing off"
    elif not overlap_grad_reduce:
        scope = "with --overlap-grad-reduce off (the default) Megatron turns bucketing off"
    else:
        scope = ""
    whole = (
        (
            f"; {scope}, so each gradient buffer is a single bucket: the check covered all of this rank's dense "
            "parameters (expert parameters are a separate buffer, checked after)"
        )
        if scope
        else ""
    )
    return (
        f"bucket #0: the index counts buckets within one bucket group, and without fp8 parameters every "
        f"group holds one bucket, so it is always #0 and names no layer{whole}."
    )


def explain_1f1b(pp: int, pp_rank: int | None) -> str:
    if pp <= 1:
        return "PP 1: every rank runs the whole model; any rank may report first."
    last = pp - 1
    head = (
        f"PP {pp_rank} is the last stage: " if pp_rank == last else f"PP {pp_rank} is not the last stage (PP {last}); "
    )
    return (
        head + f"in 1F1B the last stage (PP {last}) holds the loss, runs each micro-batch's backward "
        "first and finishes its final backward before the stages upstream, so it reaches "
        "finalize_model_grads and the gradient check first. A NaN born anywhere in the loss lands in its "
        "gradients before it reaches earlier stages: the first reporter is the last stage whatever "
        "layer the NaN started in."
    )
