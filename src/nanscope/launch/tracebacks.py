"""Reading a Megatron NaN traceback or log: the failing rank, the message, what each frame does and shows.

The text is anything from a pasted traceback to a whole job log of any size (`read_traceback` streams a
file: `logs`); the error line is `failure` (megatron-core's RerunStateMachine in mode DISABLED), the frames
are those of the traceback that ends there (`frames`), and the explanations say what the error's iteration,
bucket and rank mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nanscope.errors import UserError
from nanscope.facts import frameworks
from nanscope.facts.frameworks import PY_DICT
from nanscope.facts.megatron import Check, core_frame
from nanscope.launch import anomaly, blocks, code_lines, plugin_report
from nanscope.launch.code_lines import CodeHit
from nanscope.launch.elastic import Elastic
from nanscope.launch.error_line import error_line
from nanscope.launch.evidence import (
    UNCATALOGUED,
    UNKNOWN,
    FrameEvidence,
    Framework,
    annotate,
    framework_of,
    read_frames,
    unreleased,
)
from nanscope.launch.failure import Failure
from nanscope.launch.frames import Frame, interleaved, parse_frames, unique
from nanscope.launch.libraries import named_stack, shown
from nanscope.launch.line_pairs import pairs
from nanscope.launch.logs import Found, read_log, scan
from nanscope.launch.metric_points import STATISTIC_ONLY
from nanscope.launch.metrics import Metrics
from nanscope.launch.nonfinite import Nonfinite
from nanscope.launch.rerun import Rerun
from nanscope.launch.summary import prefix_rank
from nanscope.launch.versions import Version, printed


@dataclass
class Traceback:
    """A parsed traceback or log: the failure (None: cut before its error line), the frames, outermost first, and
    what they show."""

    failure: Failure | None
    frames: list[Frame]
    ray_ip: str | None = None
    other_ranks: list[int] = field(default_factory=list)  # later Megatron errors in the same text
    rerun: Rerun | None = None  # the rerun state machine's verdict, when the log has one
    evidence: FrameEvidence = field(default_factory=FrameEvidence)
    framework: Framework = UNKNOWN
    metrics: Metrics = field(default_factory=Metrics)  # the per-step metric lines before the failure
    notes: list[str] = field(default_factory=list)  # how the text was read, and what of it was not
    nonfinite: Nonfinite = field(default_factory=Nonfinite)  # other stacks' evidence lines, the metric lines
    prefix_rank: int | None = None  # the one rank the traceback's `[rankN]:` prefixes name (a cut traceback's rank)
    interleaved: bool = False  # several processes' frames glued mid-line, without an error line: each frame once
    lines: int = 0  # the text's lines, all of them
    error: str | None = None  # the traceback's own error line, naming no NaN, where no fatal NaN error was read
    # its known code lines (launch.code_lines) in the order met, where they outnumber its frames (`File "` lines lost)
    code: list[CodeHit] = field(default_factory=list)
    forward: list[Frame] = field(default_factory=list)  # the forward call anomaly mode printed (launch.anomaly)
    forward_cut: bool = False  # ... and the paste left lines out after its last frame
    forward_short: tuple | None = None  # ... why it ends before the op's call, and the last frame outside torch
    elastic: Elastic = field(default_factory=Elastic)  # torch elastic's first observed failure (launch.elastic)
    tracebacks: tuple[int, tuple[int, ...]] = (0, ())  # its traceback headers: how many, their first lines
    versions: list[Version] = field(default_factory=list)  # the library versions its first lines print
    native: list[tuple[int, str]] = field(default_factory=list)  # native code's error lines (launch.native_errors)

    def excursions(self) -> list:
        """The metrics' range excursions to say (launch.metrics): a non-finite one is left to the first non-finite
        metric line (launch.metric_lines), which names the key, the model and the step exactly."""
        named = any(hit.metric for hit in self.nonfinite.first.values())  # an evidence line names the metric
        exact = self.nonfinite.metrics.first is not None or named
        zeroed = [self.metrics.zeroed] if self.metrics.zeroed is not None else []  # a Trainer's 0.0 after a loss
        return [e for e in self.metrics.excursions.values() if not (exact and not math.isfinite(e.value))] + zeroed

    def loaded_then(self) -> int | None:
        """The first metric line after the checkpoint load the log names, where it is the first non-finite one too
        (what bad-checkpoint-resume makes: launch.reported); None: not so, or no load named."""
        load, first, reading = self.metrics.load_line, self.metrics.first_line, self.nonfinite.metrics.first
        if load is None or first is None or reading is None or not load < first == reading.line:
            return None
        # a model's own value (a loss, a gradient norm), not a logged statistic only (a KL beside finite ones)
        return first if not reading.points_to.startswith(STATISTIC_ONLY) else None

    def reaches(self) -> tuple[str, Frame] | None:
        """What the frames reach, by the most specific component any of them is in (facts.frameworks.COMPONENTS),
        and that frame; None: none known."""
        paths = [("/" + frame.path.replace("\\", "/").lstrip("/"), frame) for frame in self.frames]
        for suffix, what in frameworks.COMPONENTS:
            frame = next((frame for path, frame in paths if suffix in path), None)
            if frame is not None:
                return what, frame
        return None

    def megatron_frames(self) -> tuple[tuple[str, int, str], ...]:
        """The frames inside megatron-core, outermost first: (file basename, line, function)."""
        found = (core_frame(frame.path, frame.line, frame.function) for frame in self.frames)
        return tuple(frame for frame in found if frame is not None)


def parse_traceback(text: str, origin: str = "traceback") -> Traceback:
    """Parse a traceback text.

    Raises:
        UserError: no Megatron error, rerun verdict or traceback frame nanscope knows in it.
    """
    return _traceback(scan([text.encode("utf-8", "replace")], origin), origin)


def read_traceback(path: str) -> Traceback:
    """Parse a traceback file or a whole job log, of any size, read as a stream (`logs.read_log`); "-": standard
    input.

    Raises:
        UserError: not a regular file, unreadable, or nothing in it nanscope reads.
    """
    if path != "-" and str(path).endswith(".json") and (report := plugin_report.read(str(path))) is not None:
        # a nanscope plugin's report (launch.plugin_report): read as the line its plugin printed when writing it
        return _traceback(scan([plugin_report.line(report, str(path)).encode()], str(path)), str(path))
    return _traceback(read_log(path), "standard input" if path == "-" else str(path))


def _scaled_elsewhere(framework: Framework) -> Framework:
    """Megatron-LM's iteration lines whose loss scale falls while their own skip counter stays 0: Megatron-LM counts
    each step its scaler skips (core_v0.15.0rc0 megatron/training/training.py:1553-1558, :1867), so the scaler is
    another's: DeepSpeed's engine under Megatron-DeepSpeed (bigscience-workshop/bigscience tr1-13B's chronicles,
    holdout23 07)."""
    how = (f"{framework.how}, Megatron-LM's, whose loss scale falls while their own skip counter stays 0: the scaler "
           "is not Megatron-LM's (DeepSpeed's engine, as Megatron-DeepSpeed runs it)")  # fmt: skip
    return Framework(frameworks.MEGATRON_DEEPSPEED, None, how)


def _traceback(found: Found | None, origin: str) -> Traceback:
    frames, ip = parse_frames(found.context) if found is not None else ([], None)
    mixed = found is not None and found.failure is None and interleaved(found.context)
    frames = unique(frames) if mixed else frames
    code = code_lines.read(found.context) if found is not None else []
    named = _named_lines(found)
    framework = framework_of(frames, named, _keys(found), code)
    if framework.name == frameworks.MEGATRON_LM and found is not None and found.nonfinite.metrics.scale.uncounted:
        framework = _scaled_elsewhere(framework)
    if framework is UNKNOWN and found is not None and found.later:  # the frames of a traceback pasted after it
        framework = framework_of(parse_frames(found.later)[0], found.later)
    if framework is UNKNOWN and found is not None:  # an evidence line only one stack prints names it
        hit = next((hit for hit in found.nonfinite.first.values() if _one_stack(hit) is not None), None)
        if hit is not None:
            stack = _one_stack(hit)
            framework = Framework(stack, None, f"its {hit.signal.id} line (line {hit.line}) is {stack}'s")
    known = any(core_frame(frame.path, 0, "") for frame in frames) or bool(code)  # a known code line: a known frame
    code = code_lines.owned(code, code_lines.named_stacks(code, frames, framework.name))
    said = found is not None and (
        found.nonfinite.first
        or found.nonfinite.metrics.first
        or found.nonfinite.metrics.counters
        or found.nonfinite.metrics.weak
    )
    quiet = found is None or (found.failure is None and found.rerun is None and not found.metrics.seen and not said)
    if quiet and not known and framework is UNKNOWN and not (found is not None and found.quiet):
        raise UserError(
            f'{origin}: no Megatron error found (expected a line like "Rank 50, node dgx172, device 2, iteration -1: '
            "Unexpected result nan (message='...')\" in any of Megatron's forms, its message alone, or a traceback "
            "through megatron-core or a framework nanscope knows)"
        )
    if framework is UNKNOWN and (libraries := shown(frames, named)) is not None:
        framework = Framework(frameworks.UNKNOWN, None, f"{UNCATALOGUED}; the input shows {libraries}",
                              stack=named_stack(frames))  # fmt: skip
    if framework is UNKNOWN:
        framework = _uncatalogued(found) or framework
    failure = found.failure or _from_verdict(found.rerun) or from_signal(found.nonfinite)
    _merge(failure, found.rerun)
    forward = parse_frames(found.forward)[0]
    evidence = read_frames(frames)
    unreleased(failure, evidence, frames)
    code = code if len(code) > len(frames) else []  # fewer frames than known code lines: `File "` lines were lost
    evidence.lines += code_lines.evidence_lines(code) if failure is None else []  # what is left of a cut traceback
    return Traceback(
        failure,
        annotate(frames, framework),
        ray_ip=ip,
        other_ranks=found.others,
        rerun=found.rerun,
        evidence=evidence,
        framework=framework,
        metrics=found.metrics,
        notes=found.notes,
        nonfinite=found.nonfinite,
        prefix_rank=prefix_rank(found.raw),
        interleaved=mixed,
        lines=found.lines,
        error=error_line(found.context) if failure is None or (failure.signal and not failure.signal.fatal) else None,
        code=code,
        forward=forward,
        forward_cut=anomaly.last_frame(forward, found.forward)[1],
        forward_short=anomaly.short_of_op(forward, found.forward),
        elastic=found.elastic,
        tracebacks=found.tracebacks,
        versions=printed(found.head),
        native=found.native,
    )


def _uncatalogued(found: Found) -> Framework | None:
    """A stack nanscope does not catalogue, named by its own lines (None: none is): an evidence line in its words
    (guided-diffusion's), or rsl-rl's `Learning iteration N/M` block around the first non-finite metric."""
    hit = next((hit for hit in found.nonfinite.first.values() if hit.wording is not None
                and not set(hit.wording.stacks) & set(frameworks.NAMES)), None)  # fmt: skip
    if hit is not None:
        said = f"the log's {hit.signal.id} line (line {hit.line}) is printed by {hit.wording.printed_by}"
        return Framework(frameworks.UNKNOWN, None, f"{UNCATALOGUED}; {said}", stack=hit.wording.stacks[0])
    header = blocks.header_line(found.nonfinite.metrics.first)
    if header is not None:
        said = (f"its `Learning iteration N/M` block (line {header}), a key a line under it, is printed by "
                "rsl-rl's runner (rsl_rl/runners/on_policy_runner.py:178 at ff9e971)")  # fmt: skip
        return Framework(frameworks.UNKNOWN, None, f"{UNCATALOGUED}; {said}", stack=frameworks.RSL_RL)
    return None


def _one_stack(hit) -> str | None:
    """The one framework whose code prints the hit's words (None: a wording several print, or none named)."""
    stacks = hit.wording.stacks if hit.wording is not None else (hit.signal.stack,)
    return stacks[0] if len(stacks) == 1 and stacks[0] in frameworks.NAMES else None


def _keys(found: Found | None) -> set[str]:
    """The metric keys the log's lines hold (lowered): the metric lines read, and the log's first lines (a log of
    finite values only, one key a line, is read nowhere else)."""
    if found is None:
        return set()
    head = {key.lower() for line in found.head for key, _, _ in pairs(line)}
    return found.nonfinite.metrics.keys | head | ({PY_DICT} if any("{'" in line for line in found.head) else set())


def _named_lines(found: Found | None) -> list[str]:
    """The lines that may name a framework: the traceback's, the evidence lines', the first non-finite metric line,
    and the log's first lines (a logger's prefix, a trainer's banner: what names the stack of a log that says
    nothing else)."""
    if found is None:
        return []
    seen = found.nonfinite
    first = [seen.metrics.first.text] if seen.metrics.first is not None else []
    return found.raw + [hit.text for hit in seen.first.values()] + first + found.head


def from_signal(seen: Nonfinite) -> Failure | None:
    """The failure an evidence line of another stack names (facts.signals): the first fatal one, else a watchdog's
    timeout, else the first skip or warning; None: no such line."""
    hit = seen.fatal or seen.watchdog or seen.softest()
    if hit is None:
        return None
    low = hit.text.lower()
    value = hit.value or hit.signal.value
    if hit.value is None and value == "NaN or Inf" and hit.signal.id.startswith(("nonfinite", "skip", "logged")):
        nan, inf = "nan" in low, "inf" in low.replace("info", "")
        value = "NaN" if nan and not inf else "Inf" if inf and not nan else value
    return Failure(
        rank=hit.rank,
        node=None,
        device=None,
        iteration=None,
        result=None,
        kind=None if value == "-" else value,
        message=hit.detail or "",
        bucket=None,
        text=hit.text,
        line=hit.line,
        format="signal",
        rank_from=None if hit.rank is None else hit.rank_from or "the log prefix [rankN]:",
        signal=hit.signal,
        step=hit.step,
        step_from=hit.step_from,
        printed_by=None if hit.wording is None else hit.wording,
        op=hit.op,
        output=hit.output,
        detail=hit.detail,
        ranks=list(hit.ranks),
    )


def _from_verdict(rerun: Rerun | None) -> Failure | None:
    """A log with the rerun state machine's verdict but no error line: the failure the verdict names."""
    if rerun is None or rerun.rank is None:
        return None
    return Failure(
        rank=rerun.rank,
        node=rerun.node,
        device=rerun.device,
        iteration=rerun.iteration,
        result=None,
        kind=None,
        message="",
        bucket=None,
        text=rerun.text,
        line=rerun.line,
        format="rerun",
    )


def _merge(failure: Failure | None, rerun: Rerun | None) -> None:
    """The verdict's `Rank R, node N, device D` where the error line (core 0.10 to 0.13's) does not say them."""
    if failure is None or rerun is None or rerun.rank is None:
        return
    if failure.rank is None:
        failure.rank, failure.rank_from = rerun.rank, f"the rerun verdict (line {rerun.line})"
    if failure.rank == rerun.rank:
        failure.node = failure.node or rerun.node
        failure.device = failure.device if failure.device is not None else rerun.device


def explain_iteration(iteration: int, framework: str = "slime") -> str:
    """What the error's iteration counts (`framework`: the job's, facts.frameworks.NAMES)."""
    if iteration == -1 and framework != "slime":
        return (
            "iteration -1: Megatron's RerunStateMachine starts its counter at -1 and only Megatron-LM's own training "
            "loop advances it (should_run_forward_backward); a job that drives the pipeline schedule itself (slime, "
            "verl, ROLL, NeMo's Lightning loop) leaves it at -1: not a step index."
        )
    if iteration == -1:
        return (
            "iteration -1: Megatron's RerunStateMachine starts its counter at -1 and only its own "
            "training loop advances it (should_run_forward_backward); slime v0.1.0 drives "
            "train_one_step itself and never does, so it is always -1: not a rollout or step index."
        )
    if framework == "slime":
        return (
            f"iteration {iteration}: the RerunStateMachine's counter (advanced by Megatron's training loop, "
            "not by slime v0.1.0)."
        )
    if framework in frameworks.MEGATRON_LOOP:
        return (
            f"iteration {iteration}: the RerunStateMachine's counter, advanced each iteration by the training loop "
            "this job runs (Megatron-LM's, or Megatron-Bridge's: should_run_forward_backward): its training iteration."
        )
    return (
        f"iteration {iteration}: the RerunStateMachine's counter, advanced only by a loop that calls "
        "should_run_forward_backward (Megatron-LM's and Megatron-Bridge's training loops; verl and ROLL drive the "
        "schedule themselves and leave it at -1): a count of that loop's iterations."
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
            f"; {scope}, so each gradient buffer is a single bucket: the check covered the gradients of all of this "
            "rank's dense parameters that train (under LoRA, its adapters; expert parameters are a separate buffer, "
            "checked after)"
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


def explain_stage(pp: int, pp_rank: int | None, check: Check | None = None) -> str:
    """Why this stage reported: the gradient checks (`explain_1f1b`), or the loss checks, on the last stage only."""
    if check is None or check.quantity == "gradient":
        return explain_1f1b(pp, pp_rank)
    if pp <= 1:
        return "PP 1: every rank computes the loss; any rank may report first."
    last = pp - 1
    head = (
        f"PP {pp_rank} is the last stage: " if pp_rank == last else f"PP {pp_rank} is not the last stage (PP {last}): "
    )
    return (
        head + f"the loss, and so its check, is computed on the last stage (PP {last}) only, at the end of each "
        "micro-batch's forward pass; a non-finite value there can have started in any stage's layers."
    )


def explain_check(failure: Failure) -> str:
    """What the error's message says about the check that raised it ('' for the bucket NaN/Inf check)."""
    check = failure.check
    if check is None:
        return (
            f"message '{failure.message}': not one of the checks nanscope knows (megatron-core's bucket gradient "
            "checks, Megatron-LM's forward-loss checks): a validate_result call of the job's own code; "
            "nothing is ruled out by it."
        )
    if check.slime and check.value != "large":
        return ""
    if check.id == "large-grads":
        return (
            f"'found unexpected large grads' ({check.source}): --check-for-large-grads compared the bucket's "
            "finite gradient norm with the largest of its first 100 checks and found it at least 10 times as large "
            "(is_unexpectedly_large, rerun_state_machine.py:649-717; it passes over NaN and Inf); the check is "
            "marked non-fatal, but with the rerun state machine disabled it raises all the same."
        )
    return (
        f"'{check.message}' ({check.source}): Megatron-LM's own training loop checks its forward loss here "
        "(loss_func, a masked sum of the token losses); slime computes its loss in its own loss function and "
        "never runs this loop, so the job that wrote this traceback was not slime's."
    )
