"""NaN and Inf evidence lines of every stack (facts.signals), read one line at a time.

    [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768
    Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.
    RuntimeError: Function 'Log1PBackward0' returned nan values in its 0th output.
    Warning: Error detected in StackBackward. Traceback of forward call that caused the error:
    [rank5]: RuntimeError: probability tensor contains either `inf`, `nan` or element < 0
    ...TensorCompare.cu:110: _assert_async_cuda_kernel: ... Assertion `probability tensor contains ...` failed.
    [E ProcessGroupNCCL.cpp:828] [Rank 38] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4447361, ...
    (WorkerDict pid=9092) WARN: grad_norm is not finite: nan
    2025-04-27 17:00:18,438 WARNING get infinite grad_norm, check your code/data if it appears frequently
    DLL 2020-05-28 08:54:08.810592 - PARAMETER loss_scale : 262144.0      (a step skipped: apex amp's new scale)
    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 13.91 GiB. GPU 0 has ...   (not a NaN: memory)
    WARNING: found inf during ShardedOptimV2 step            (wrapped over two lines by a rich console)
    NaN or Inf found in input tensor.
    ValueError: Input contains NaN.                          (any error line naming NaN or Inf)
    loss is nan, stopping training                          (any line saying a loss or gradient is NaN or Inf)

A line is read only if it holds one of MARKERS (literals; the log reader searches them at the speed of a literal
search) or a NaN/Inf word; each pattern is applied to a window of WINDOW characters around its literal anchor, with
bounded repeats only: the time is linear in the line. A wrapped line is read with the end of the line before it.

    hit = read_line(line, number, before=previous_line)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nanscope.facts.signals import BY_ID, WORDING, Signal, Wording
from nanscope.launch import error_words, glued, plugin_report, said_errors, scaler_lines
from nanscope.launch.bars import bars
from nanscope.launch.cuts import cut
from nanscope.launch.memory import out_of_memory

WINDOW = 2048  # characters read after an anchor (and 512 before it)
MARKERS = (
    b"OVERFLOW!",
    b"loss scale overflow!",
    b"Overflow detected",
    b"already at minimum",
    b"returned nan values",
    b"returned inf values",
    b"Error detected in",
    b"probability tensor contains",
    b"probs detected",
    b"device-side assert",
    b"Assertion `",
    b"Watchdog caught collective",
    b"not finite",
    b"NaN or Inf found",
    b"python_anomaly_mode.cpp",
    b"Bad grad_norm detected",
    b"Watchdog caught",
    b"NCCL operations have failed",
    b"iterations in a row due to Overflow",
    b"Skipping step. Attempted loss scale",
    b"PARAMETER loss_scale",
    b"rad scale is small",
    b"grad_scale is too small",
    b"out of memory",
    b"Could not infer dtype of NoneType",
    b"Skipping updating the model",
    b"decreased lg_loss_scale to",
)  # fmt: skip (the log reader searches launch.nonfinite.NEEDLES, these less those with a NaN/Inf word)
_ANOMALY = re.compile(
    r"Function '(?P<op>[\w.<>]{1,200})' returned (?P<value>nan|inf) values in its (?P<output>\d{1,4})\w{0,2} output"
)
_FORWARD = re.compile(r"Error detected in (?P<op>[\w.<>]{1,200})\. Traceback of forward call")
_FORWARD_HEAD = re.compile(r"Error detected in (?P<op>[\w.<>]{0,200})\s*\Z")
_FORWARD_TAIL = re.compile(r"\s*(?P<op>[\w.<>]{0,200})\. Traceback of forward call")
_ASSERTION = re.compile(r"Assertion `(?P<op>.{1,300}?)` failed")
_WATCHDOG = re.compile(r"(?:\[Rank (?P<rank>\d{1,9})\] )?Watchdog caught collective operation timeout: WorkNCCL\((?P<work>[^)]{0,600})\)")  # fmt: skip
_OP_TYPE = re.compile(r"OpType=(?P<op>\w{1,40})")
_SEQ = re.compile(r"SeqNum=(?P<seq>\d{1,20})")
_NOT_FINITE = re.compile(r"(?:rank (?P<rank>\d{1,9}) )?grad_norm is not finite: (?P<value>\S{1,40})")
_FOUND_INF = re.compile(
    r"found\s{1,60}(?P<value>inf|nan)\s{1,60}during\s{1,60}(?P<op>\w{1,80})\s{1,60}step", re.IGNORECASE
)
# an exception's name after a line's start, a space, `:`, `]`, `>`, or its module's dotted path
# (`tensorflow.python.framework.errors_impl.InvalidArgumentError: ...`: tensorflow/agents#622, holdout25 13)
_ERROR = re.compile(r"(?:^|[\s:\]>]|(?<=\w)\.)(?P<exc>[A-Z][A-Za-z]{0,60}(?:Error|Exception)|Exception)(?:\([\w.]{0,80}\))?: (?P<msg>.{0,400})")  # fmt: skip
_NONFINITE = re.compile(
    r"(?<![A-Za-z])(?P<word>nan|inf(?:inity|inite)?|non-?finite|not finite)(?![A-Za-z])", re.IGNORECASE
)
_SAYS = re.compile(
    r"\b(?P<what>loss(?:es)?|grad(?:ient)?s?(?:[ _]norm)?|weights?|logits|outputs?|activations?)\b[^.\n]{0,40}?"
    r"\b(?:is|are|was|were|became|becomes|contains?|got|gets|detected|occurs?|has|have)\b[^.\n]{0,20}?"
    r"(?<![A-Za-z])(?:nan|inf|infinite|infinity|non-?finite|not finite)(?![A-Za-z])"
    r"(?:\s?(?:or|and|/)\s?(?:nan|inf|infinite|infinity)(?![A-Za-z]))?"  # `Loss is NaN or inf`: said whole
    r"|(?<![A-Za-z])(?:nan|inf)[ _](?P<what2>loss|grad(?:ient)?s?(?:[ _]norm)?)\b[^.\n]{0,20}?"
    r"\b(?:detected|occurs?|found|encountered)\b"
    r"|\bfound (?:an? )?(?:nan|inf)s?\b(?! during)"
    r"|\b(?:get|gets|got|getting)\s(?:an?\s)?(?:nan|inf|infinite|non-?finite)\s(?P<what3>loss|grad(?:ient)?s?(?:[ _]norm)?)\b"
    r"|\b(?:detected|encountered|got)\s(?:an?\s)?(?:nan|inf)\b",
    re.IGNORECASE,
)
# every alternative of _SAYS holds one of these (a literal search first: _SAYS itself costs a Megatron log's every line)
_SAYS_WORDS = ("is", "are", "was", "were", "became", "contain", "got", "get", "detected", "occur", "has", "have",
               "found", "encountered")  # fmt: skip
# a check's own flag set true (`GRAD_NaN fwd=1 llm_input shape=[2, 2314, 4096] nan=True inf=False`: a hook's line,
# KawaiiLLM docs/debug_nan_training.md, holdout20 10): the value it checked held a NaN or an Inf
# (`key=True` only: an indented `nan: True` is a config's echo)
_FLAGGED = re.compile(
    r"(?<![\w.])(?:has_|is_|any_|contains_)?(?P<word>nan|inf)(?:_found|_detected)?=True\b", re.IGNORECASE
)
_RANK_TAG = re.compile(r"\[rank(?P<rank>\d{1,9})\]:")
# a tensor's repr (torch/_tensor_str.py): `tensor(`, nested `[`, then its values up to the first `)` or `device=`;
# bounded repeats, no nested quantifier: linear
# a tensor's repr, or NumPy's (`array([nan, nan, nan], dtype=float32)`: henrycharlesworth/big2_PPOalgorithm#8,
# holdout23 14, a list of per-update loss arrays)
_TENSOR = re.compile(r"\b(?P<kind>tensor|array)\(\[{0,8}(?P<values>[^()=\n]{0,400})")
_TENSOR_KEYWORD = re.compile(r",\s{0,4}[a-z_]{1,20}\Z")  # the `, device` before the first `=` the values stop at
_STEP = re.compile(r"\b(?:step|iteration|global_step)\s?[:=]?\s?(?P<step>\d{1,12})\b", re.IGNORECASE)


@dataclass
class Hit:
    """One evidence line.

    Attributes:
        signal: what kind (facts.signals).
        line: 1-based line of the log.
        text: the line, cut to 300 characters.
        rank: the failing rank the line names (`[rank5]:`); None where it names none, or only a logging or
            waiting rank (DeepSpeed's `Rank 0`, the watchdog's `[Rank 38]`: in `ranks`).
        ranks: other ranks the line names, and as what.
        step: the step the line names (None: not said).
        op: the backward function, the assert, the collective or the exception the line names.
        output: the backward function's output index (anomaly mode).
        detail: the rest in words ("loss scale 65536 -> 32768", "ALLREDUCE SeqNum=4447361").
    """

    signal: Signal
    line: int
    text: str
    rank: int | None = None
    ranks: list[str] = field(default_factory=list)
    step: int | None = None
    op: str | None = None
    output: int | None = None
    detail: str | None = None
    metric: str | None = None  # the metric the line names as non-finite (`grad_norm is not finite`)
    wording: Wording | None = None  # which stack's words these are (facts.signals.WORDINGS), where known
    value: str | None = None  # what the line says was non-finite, where its words say it (else the signal's)
    step_from: str | None = None  # where the step came from
    scale: float | None = None  # a loss scaler's attempted scale
    next_scale: float | None = None  # ... and the scale it set (the same: hysteresis spent, or its floor)
    at: int = 0  # where on the line its evidence starts (what sits before it: a progress bar)
    rank_from: str | None = None  # where the rank came from: the line's words, else its `[rankN]:` prefix
    caller: str | None = None  # the RL trainer's call in the code pasted just before it (`ppo_trainer.generate`)


def read_line(line: str, number: int, before: str = "", after: str = "") -> Hit | None:
    """The evidence `line` (the log's line `number`; `before`, `after`: the lines around it, for a wrapped one)
    holds."""
    hit = _known(unwrapped(line), before, after)  # a terminal's wrap re-joined with spaces, undone
    if hit is None:
        hit = cut(line)
    if hit is None:
        hit = _generic(line)
    if hit is None:
        return None
    signal, fields = hit
    if signal.id in ("nonfinite-message", "nonfinite-error") and (had := error_words.tensor_had(line)) is not None:
        fields = {**fields, **had}  # TensorFlow's CheckNumerics says which it found, whatever its caller's words
    if signal.id == "printed-tensor" and "metric" not in fields and (name := error_words.prompt_name(before)):
        fields = {
            **fields,
            "metric": name,
            "detail": f"{name}, printed at the prompt on the line before: {fields['detail']}",
        }
    found = Hit(signal, number, line.strip()[:300], **fields)
    found.at = _start(line)
    tag = _RANK_TAG.search(line, 0, WINDOW) if "[rank" in line else None
    if tag is not None and signal.id == "nccl-timeout":  # the process that timed out: one left waiting
        said = f"rank {tag['rank']} waited (the watchdog's rank)"
        found.ranks += [] if said in found.ranks else [said]
    elif tag is not None and found.rank is None:
        found.rank, found.rank_from = int(tag["rank"]), "the log prefix [rankN]:"
    if found.step is None and (step := _STEP.search(line, found.at, found.at + WINDOW)) is not None:
        found.step, found.step_from = int(step["step"]), "the line"
    return found


_WRAPPED = re.compile(r"(?<=[a-z])\s{8,120}(?=[a-z:])")
_EVIDENCE_START = re.compile(r"\[\d{4}-\d\d-\d\d[ T]|\[(?:deepspeed|deepscale)\]|\[rank\d{1,9}\]:|\.\./aten/|Traceback|WARN|"
                             r"\[E |Error|Exception|NaN or Inf|OVERFLOW|Overflow|Grad overflow")  # fmt: skip


def unwrapped(line: str) -> str:
    """`line` with a terminal's wrap undone: a run of spaces inside a word (`Attempted loss scal<33 spaces>e: 8192`,
    a wrapped line re-joined with the padding the terminal printed) removed."""
    return _WRAPPED.sub("", line[:WINDOW]) if "        " in line else line


def _start(line: str) -> int:
    """Where a line's own text starts after a progress bar it is glued to (0: no bar before it)."""
    close = line.rfind("]", 0, WINDOW)
    found = _EVIDENCE_START.search(line, 0, WINDOW)
    if close >= 0 and "/" in line[:close]:
        return found.start() if found is not None else 0
    # a bar cut at the terminal's width before its `]` (`20%|▏| 9929/50000 [1:55:09<10:34:44,  1.05i/opt/...`)
    return found.start() if found is not None and found.start() and bars(line[: found.start()]) else 0


def _window(line: str, anchor: str) -> tuple[str, int] | None:
    """(the part of `line` around the first `anchor`, where it starts), None: no anchor."""
    at = line.find(anchor)
    if at < 0:
        return None
    low = max(0, at - 512)
    return line[low : at + WINDOW], low


def _known(line: str, before: str, after: str) -> tuple[Signal, dict] | None:
    """The evidence of a named stack's line."""
    for anchor, reader in _READERS:
        part = _window(line, anchor) if anchor in line else None  # a literal test first: most lines hold none
        if part is not None:
            read = reader(part[0], after if reader is _forward else before)
            if read is not None:
                return read
    if "inf during" in line[:WINDOW] or "nan during" in line[:WINDOW]:  # a rich console wrapped `found` away
        found = _FOUND_INF.search((before[-200:] + " " + line[:WINDOW]).replace("\n", " "))
        if found is not None:
            return BY_ID["skip-nonfinite-grad"], {
                "op": found["op"],
                "detail": f"found {found['value']} ({found['op']}): ColossalAI counts inf or NaN",
                "wording": WORDING["colossalai-found-inf"],
                "value": "NaN or Inf",
            }
    return None


def _anomaly(text: str, before: str):
    match = _ANOMALY.search(text)
    if match is None:
        return None
    output = int(match["output"])
    return BY_ID["anomaly-nan"], {"op": match["op"], "output": output, "detail": f"{match['value']} in output {output}"}


def _forward(text: str, after: str):
    match = _FORWARD.search(text)
    op = None if match is None else match["op"]
    if match is None:  # `Error detected in StackBa` / `ckward. Traceback of forward call`: a terminal's wrap
        head, tail = _FORWARD_HEAD.search(text), _FORWARD_TAIL.match(after[:300])
        if tail is None or head is None:
            return None
        op = head["op"] + tail["op"]
    return BY_ID["anomaly-forward"], {"op": op, "detail": "the forward call of the failing backward function"}


def _probability(text: str, before: str):
    device = "Assertion" in text or "device-side assert" in text  # the kernel's own assert, or the words about it
    where = "a CUDA device-side assert (asynchronous)" if device else "a RuntimeError the call raised"
    return BY_ID["probability-assert"], {"op": "torch.multinomial (sampling)", "detail": where}


_BAD_PROBS = re.compile(
    r"probs detected\W{0,8}(?P<flags>(?:(?:NaN|Inf|Neg)\w{0,12}\s{0,2}[:=]\s{0,2}(?:True|False)\W{0,4}){1,3})"
)


_FOUND_TRUE = re.compile(r"(?:NaN|Inf)\w{0,12}\s{0,2}[:=]\s{0,2}True")


def _bad_probs(text: str, before: str):
    match = _BAD_PROBS.search(text)
    if match is None or _FOUND_TRUE.search(match["flags"]) is None:  # a negative probability is no NaN or Inf
        return None
    return BY_ID["bad-probs"], {"op": "sampling", "detail": match["flags"].strip(" ,;")}


def _assertion(text: str, before: str):
    match = _ASSERTION.search(text)
    if match is not None and "probability tensor" in match["op"]:
        return _probability(text, before)
    return BY_ID["device-assert"], {"op": None if match is None else match["op"][:120]}


def _watchdog(text: str, before: str):
    match = _WATCHDOG.search(text)
    if match is None:
        return None
    op, seq = _OP_TYPE.search(match["work"]), _SEQ.search(match["work"])
    detail = " ".join(part for part in (op and op["op"], seq and f"SeqNum={seq['seq']}") if part) or None
    ranks = [] if match["rank"] is None else [f"rank {match['rank']} waited (the watchdog's rank)"]
    return BY_ID["nccl-timeout"], {"op": op and op["op"], "detail": detail, "ranks": ranks}


def _nccl(text: str, before: str):
    return BY_ID["nccl-timeout"], {"detail": "NCCL operations failed or timed out"}


def _not_finite(text: str, before: str):
    match = _NOT_FINITE.search(text)
    if match is None:
        return None
    actor = match["rank"] is not None  # only verl's actor names its rank (facts.signals: verl-actor-not-finite)
    return _skipped(match["value"], "verl-actor-not-finite" if actor else "verl-not-finite",
                    rank=int(match["rank"]) if actor else None,
                    rank_from="the line's words (verl's actor prints its rank)" if actor else None)  # fmt: skip


def _skipped(norm: str, wording: str, **fields):
    """A framework's skip of the optimizer step on the gradient norm `norm`, as printed (facts.signals WORDINGS'
    `wording`), with the reader's own `fields`."""
    return BY_ID["skip-nonfinite-grad"], {"detail": f"grad_norm {norm}: the step skipped", "metric": "grad_norm",
                                          "wording": WORDING[wording], **fields}  # fmt: skip


_BAD_NORM = re.compile(r"Bad grad_norm detected \(grad_norm=(?P<value>[\w.+-]{1,40})\)")


def _bad_norm(text: str, before: str):
    match = _BAD_NORM.search(text)
    return None if match is None else _skipped(match["value"], "megatron-llm-bad-grad-norm")


_CALL = re.compile(r"(?P<name>[A-Za-z_]\w{0,80})\s?\(")


def _anomaly_tail(text: str, before: str):
    """The end of anomaly mode's warning, its header cut: `(Triggered internally at
    ../torch/csrc/autograd/python_anomaly_mode.cpp:110.)` after the forward frame's line, which names its op."""
    if "Triggered internally at" not in text:
        return None
    code = before.strip()
    calls = [match["name"] for match in _CALL.finditer(code[:300])]
    op = calls[-1] if calls and not code.startswith("File ") else None
    detail = f"its header cut; the forward frame: {code[:120]}" if code else "its header and forward frames cut"
    return BY_ID["anomaly-forward"], {"op": op, "detail": detail}


def _infinite_norm(text: str, before: str):
    """CosyVoice's (wenet's) `get infinite grad_norm, check your code/data if it appears frequently`: its check is
    torch.isfinite, so NaN prints the same words; the optimizer step is skipped."""
    if "get infinite grad_norm" not in text:
        return None
    return BY_ID["skip-nonfinite-grad"], {
        "detail": "grad_norm not finite (its check, torch.isfinite, fails on NaN and Inf alike): the step skipped",
        "metric": "grad_norm",
        "wording": WORDING["wenet-infinite-grad-norm"],
        "value": "NaN or Inf",
    }


# ESPnet2's trainer: `logging.warning(f"The grad norm is {grad_norm}. Skipping updating the model.")` where
# torch.isfinite(grad_norm) fails (espnet 202412 espnet2/train/trainer.py:710-713; FunASR 1.1.0
# funasr/train_utils/trainer.py:438, trainer_ds.py:706 print the same words): espnet/espnet#3170, holdout25 22. The
# norm is a float under torch 1.4 (`is nan.`), a tensor since (`is tensor(nan, device='cuda:0').`)
_SKIPPING_UPDATE = re.compile(
    r"The grad norm is (?:tensor\()?(?P<value>[-+]?(?:nan|inf))[^.\n]{0,80}?\. Skipping updating the model"
)


def _skipping_update(text: str, before: str):
    match = _SKIPPING_UPDATE.search(text)
    if match is None:
        return None
    return _skipped(match["value"], "espnet-skipping-update", value="Inf" if "inf" in match["value"] else "NaN")


def _logged(text: str, before: str):
    return BY_ID["logged-nonfinite"], {"detail": "a logged scalar is NaN or Inf"}


# (literal anchor, reader of the window around it), in order: the first that reads the line wins
_READERS = (
    ("OVERFLOW!", scaler_lines.overflow), ("loss scale overflow!", scaler_lines.overflow), ("Overflow detected", scaler_lines.overflow),
    ("Skipping step. Attempted loss scale", scaler_lines.overflow),  # DeepSpeed's line without its `[deepspeed] OVERFLOW!` head
    ("Grad overflow on iteration", scaler_lines.grad_overflow), ("in a row due to Overflow", scaler_lines.overflow_exit), ("verflow", scaler_lines.scaler), ("already at minimum", scaler_lines.minimum), ("returned nan values", _anomaly), ("returned inf values", _anomaly),
    ("Error detected in", _forward),
    ("probability tensor contains", _probability), ("probs detected", _bad_probs), ("Assertion `", _assertion), ("device-side assert", _assertion),
    ("Watchdog caught collective", _watchdog), ("NCCL operations have failed or timed out", _nccl), ("not finite", _not_finite), ("NaN or Inf found", _logged), ("Skipping updating the model", _skipping_update), (scaler_lines.LG_ANCHOR, scaler_lines.lg_scale),
    ("Bad grad_norm detected", _bad_norm), ("python_anomaly_mode.cpp", _anomaly_tail),
    (plugin_report.ANCHOR, plugin_report.evidence), (plugin_report.WARNING_ANCHOR, plugin_report.warning_evidence),
    ("but found invalid values", error_words.distribution), ("infinite grad_norm", _infinite_norm), ("PARAMETER loss_scale", scaler_lines.dle_scale), ("rad scale is small", scaler_lines.grad_scale), ("grad_scale is too small", scaler_lines.grad_scale), ("CUDA out of memory", out_of_memory), (said_errors.TERMINATE_ANCHOR, said_errors.terminate_on_nan), (said_errors.DIVERGED_ANCHOR, said_errors.diverged), (said_errors.MESSAGE_ANCHOR, said_errors.json_message), (said_errors.JSON_FLOAT_ANCHOR, said_errors.json_float), (said_errors.NONE_ANCHOR, said_errors.none_logprob),
)  # fmt: skip


def _printed_tensor(head: str) -> tuple[Signal, dict] | None:
    """An unnamed tensor's repr holding nan or inf among its values: its kind and its values (a tensor after a name,
    `loss: tensor(nan)`, is the metric lines' to read: launch.metric_lines)."""
    for match in _TENSOR.finditer(head):
        before = head[max(0, match.start() - 40) : match.start()].rstrip().rstrip(":=").rstrip()
        if before and (before[-1].isalnum() or before[-1] in "'\"_"):
            continue
        words = {word["word"].lower() for word in _NONFINITE.finditer(match["values"])}
        if words & {"nan", "inf"}:
            value = "NaN" if words == {"nan"} else "Inf" if words == {"inf"} else "NaN or Inf"
            shown = _TENSOR_KEYWORD.sub("", match["values"]).strip(" ,[]")[:80]
            array = " (a NumPy array)" if match["kind"] == "array" else ""
            return BY_ID["printed-tensor"], {"detail": f"its values {shown}{array}", "value": value}
    return None


def _generic(line: str) -> tuple[Signal, dict] | None:
    """An error line whose message names NaN or Inf, a line saying a loss or a gradient is NaN or Inf, or a printed
    tensor that holds NaN or Inf."""
    head = line[:WINDOW]
    error = (_ERROR.search(head) or glued.frame_error(head)) if ("Error" in head or "Exception" in head) else None
    if error is not None and _NONFINITE.search(error["msg"]) is not None:
        return BY_ID["nonfinite-error"], {"op": error["exc"], "detail": error["msg"].strip()[:200],
                                          "metric": error_words.first_key(error["msg"])}  # fmt: skip
    warned = error_words.python_warning(head) if "Warning: " in head else None
    if warned is not None:
        return warned
    printed = "tensor(" in head or "array([" in head  # a tensor's repr, or NumPy's
    tensor = (_printed_tensor(head) or error_words.named_tensor(head)) if printed else None
    if tensor is not None:
        return tensor
    low = head.lower()
    says = _SAYS.search(head) if any(word in low for word in _SAYS_WORDS) else None
    if says is not None:
        return BY_ID["nonfinite-message"], {"detail": says.group(0)[:200]}
    flagged = _FLAGGED.search(head) if "=true" in low else None
    if flagged is not None:
        return BY_ID["nonfinite-message"], {"detail": head.strip()[:200], "op": flagged.group(0)}
    return _unnamed(head)


# a row's value: a number, NaN or Inf, or a placeholder for a term not computed (`----`)
_BARE = re.compile(r"[-+]?(?:nan|inf|\d{1,12}(?:\.\d{1,12})?(?:[eE][-+]?\d{1,3})?)|-{2,8}", re.IGNORECASE)
_STAMP_TOKEN = re.compile(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d(?:[.,]\d{1,6})?")  # a log prefix's date, its time


def _unnamed(head: str) -> tuple[Signal, dict] | None:
    """A row of at least four values and nothing else but a time stamp, two of them NaN or Inf (`2024-05-27
    12:23:01,982 4 ---- ---- nan nan`: isl-org/PhotorealismEnhancement#66, holdout25 07: its terms in fixed columns)."""
    tokens = head.split()
    while tokens and _STAMP_TOKEN.fullmatch(tokens[0]):
        tokens.pop(0)
    if len(tokens) < 4 or not all(_BARE.fullmatch(token) for token in tokens):
        return None
    bad = {token.lower().lstrip("+-") for token in tokens} & {"nan", "inf"}
    count = sum(token.lower().lstrip("+-") in bad for token in tokens)
    if count < 2:
        return None
    value = "NaN" if bad == {"nan"} else "Inf" if bad == {"inf"} else "NaN or Inf"
    return BY_ID["unnamed-values"], {"detail": f"{count} of its values {value}", "value": value}
