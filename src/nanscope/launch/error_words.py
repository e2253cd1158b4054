"""Evidence lines whose words name what went non-finite, read for that name (launch.signals calls these):

    ValueError: loss=nan, policy_loss=nan, entropy_loss=nan, advantage_loss=nan      an error naming its values
    ValueError: Expected parameter logits (Tensor of shape (280, 13)) of distribution Categorical(logits: ...) to
        satisfy the constraint IndependentConstraint(Real(), 1), but found invalid values:    torch.distributions
    /data/git/max/imagination.py:49: UserWarning: NaN in sampled next states!          a Python warning
     tensor_recv_next: tensor([[[        inf,         inf, ...                          a named printed tensor

Each regex is applied to a bounded window after a literal found first, with bounded repeats only: linear in the line.

    key = first_key(message)              # the first `key=nan` / `key: inf` of an error's message, as written
    read = distribution(text, before)     # (signal, fields) of torch.distributions' validation error, or None
    read = python_warning(line)           # ... of a warnings.warn line whose message names NaN or Inf, or None
    read = named_tensor(line)             # ... of a multi-element tensor printed after its name, or None
    place_assert(hit, line, following)    # a CUDA assert's rank (the traceback after it), its text's start
"""

from __future__ import annotations

import re

from nanscope.facts.signals import BY_ID, Signal
from nanscope.launch import said_errors
from nanscope.launch.bars import last_bar

WINDOW = said_errors.WINDOW  # characters read after a literal anchor (one window for both)
_NONFINITE = re.compile(r"(?<![A-Za-z])(?P<word>nan|inf(?:inity|inite)?|non-?finite)(?![A-Za-z])", re.IGNORECASE)
# an error message's `key=nan` / `key: inf` (the key as written: `entropy_loss`, not `entropy`)
_KEY_VALUE = re.compile(
    r"(?<![\w./-])(?P<key>[A-Za-z_][\w./-]{0,80})\s{0,3}[=:]\s{0,3}['\"]?[-+]?(?:nan|inf(?:inity)?)(?![\w.])",
    re.IGNORECASE,
)


# a message naming its loss after the NaN (mozilla/TTS TTS/tts/layers/losses.py:398 at the reporter's version, #668:
# `raise RuntimeError(f" [!] NaN loss with {key}.")`)
_NAN_WITH = re.compile(r"(?<![A-Za-z])(?:nan|inf)\s{1,3}loss\s{1,3}(?:with|in|of|for)\s{1,3}(?P<key>[A-Za-z_][\w./-]{0,80})",
                       re.IGNORECASE)  # fmt: skip


def first_key(message: str) -> str | None:
    """The first key an error's message gives a NaN/Inf value (`loss=nan, policy_loss=nan`: `loss`; `NaN loss with
    decoder_loss.`: `decoder_loss`; `Loss is not finite`: `Loss`); None: none."""
    match = _KEY_VALUE.search(message, 0, WINDOW) or _NAN_WITH.search(message, 0, WINDOW)
    return said_errors.subject(message) if match is None else match["key"].rstrip(".")


# TensorFlow's CheckNumerics op (tf.debugging.check_numerics; assert_all_finite's `VerifyFinite` scope) raises
# InvalidArgumentError(message, " : Tensor had ", status, " values"), its status "Inf and NaN", "NaN" or "Inf" by
# what it found (tensorflow 07ca580 tensorflow/core/kernels/check_numerics_op.cc:83-97, the GPU kernel's the same
# words); the message before it is the caller's (tensorforce's `Invalid gradient: contains inf or nan.`), naming both
_TENSOR_HAD = re.compile(r" : Tensor had (?P<status>Inf and NaN|NaN|Inf) values")


def tensor_had(line: str) -> dict | None:
    """The value CheckNumerics' own words say it found (`... : Tensor had NaN values`: NaN), and a detail saying so;
    None: no such words."""
    match = _TENSOR_HAD.search(line, 0, WINDOW) if " : Tensor had " in line[:WINDOW] else None
    if match is None:
        return None
    status = match["status"]
    value = "NaN or Inf" if status == "Inf and NaN" else status
    said = "both" if status == "Inf and NaN" else status
    return {"value": value, "detail": f"Tensor had {status} values: TensorFlow's CheckNumerics found {said} (the "
                                      "words before it are its caller's message)"}  # fmt: skip


# torch.distributions' argument validation (torch 2.13 torch/distributions/distribution.py:75-82, Distribution.__init__:
# `valid = constraint.check(value)`, then ValueError(f"Expected parameter {param} ({type(value).__name__} of shape
# {tuple(value.shape)}) of distribution {repr(self)} to satisfy the constraint {repr(constraint)}, but found invalid
# values:\n{value}"); the value printed on the lines after it
_DISTRIBUTION = re.compile(
    r"Expected parameter (?P<param>\w{1,60}) \((?P<kind>\w{1,40}) of shape (?P<shape>\([\d, ]{0,80}\))\) of "
    r"distribution (?P<dist>[A-Za-z_]\w{0,60})\("
)
_CONSTRAINT = re.compile(r"to satisfy the constraint (?P<constraint>[^\n]{1,200}?), but found invalid values")


WRAPPED = 300  # characters of the line before read where the message wrapped onto the anchor's line


def distribution(text: str, before: str = "") -> tuple[Signal, dict] | None:
    """torch.distributions' ValueError: a distribution's parameter (a policy's logits or probabilities) failed its
    constraint. A `Real()` constraint fails on NaN alone (torch 2.13 torch/distributions/constraints.py:419-425,
    _Real.check: `value == value`): the parameter holds NaN."""
    match = _DISTRIBUTION.search(text, 0, WINDOW)
    if match is None and before:  # the message wrapped after `distribution Categorical(logits: ` (voidful/TextRL#21)
        text = before[-WRAPPED:] + " " + text[:WINDOW]
        match = _DISTRIBUTION.search(text)
    if match is None:
        return None
    constraint = _CONSTRAINT.search(text, match.end(), match.end() + WINDOW)
    said = "" if constraint is None else constraint["constraint"]
    real = said.startswith(("Real()", "IndependentConstraint(Real()"))
    detail = (f"torch.distributions: {match['dist']}'s parameter {match['param']} ({match['kind']} of shape "
              f"{match['shape']}) failed its constraint {said or '(cut)'}"
              + (": NaN (Real() fails on NaN alone)" if real else ": non-finite or outside its support")
              + f"; the {match['param']} the policy computed are invalid")  # fmt: skip
    return BY_ID["nonfinite-error"], {
        "op": "ValueError",
        "detail": detail[:300],
        "metric": match["param"],
        "value": "NaN" if real else "NaN or Inf",
    }


# warnings.formatwarning's `{filename}:{lineno}: {category}: {message}` (CPython Lib/warnings.py, _formatwarnmsg_impl)
_WARNING = re.compile(r"(?P<file>[^\s:]{1,300}?\.py):(?P<line>\d{1,7}): (?P<category>[A-Z][A-Za-z]{0,60}Warning): ")


def python_warning(line: str) -> tuple[Signal, dict] | None:
    """A Python warning whose message names NaN or Inf (`imagination.py:49: UserWarning: NaN in sampled next states!`):
    evidence that names the file and line that warned and its words (no metric: the category is no metric's name)."""
    at = line.find("Warning: ", 0, WINDOW)
    if at < 0:
        return None
    match = _WARNING.search(line, max(0, at - 400), at + 9)
    if match is None:
        return None
    message = line[match.end() : match.end() + 300].strip()
    words = {word["word"].lower() for word in _NONFINITE.finditer(message)}
    if not words:
        return None
    value = "NaN" if words == {"nan"} else "Inf" if words <= {"inf", "infinity", "infinite"} else "NaN or Inf"
    where = f"{match['file'].rsplit('/', 1)[-1]}:{match['line']}"
    return BY_ID["nonfinite-message"], {
        "op": match["category"],
        "detail": f"a {match['category']} at {where} ({match['file']}) says: {message[:160]}",
        "value": value,
    }


# a tensor printed after its name (`name: tensor([[...` / `name = tensor([...`), values up to the first `)` or `=`
_NAMED_TENSOR = re.compile(
    r"(?P<name>[A-Za-z_][\w.]{0,80})\s{0,4}[:=]\s{0,4}tensor\((?P<values>\[{1,8}[^()=\n]{0,400})"
)
# Megatron's pipeline p2p buffers (megatron-core 0.15.0rc0 pipeline_parallel/p2p_communication.py:21-44: irecv into
# tensor_recv_prev from the previous rank, tensor_recv_next from the next; recv_backward, :434-450, receives the output
# tensor's gradient from the next stage into tensor_recv_next, recv_forward the input activation into tensor_recv_prev)
_P2P = {
    "tensor_recv_next": "the pipeline stage received it from the next stage (in the backward: the gradient of its "
    "output): a later stage went non-finite first",
    "tensor_recv_prev": "the pipeline stage received it from the previous stage (in the forward: its input "
    "activation): an earlier stage went non-finite first",
}


def named_tensor(line: str) -> tuple[Signal, dict] | None:
    """A multi-element tensor printed after its name, holding NaN or Inf (`tensor_recv_next: tensor([[[ inf, ...`):
    evidence naming it (a one-element `loss: tensor(nan)` is a metric line's value: launch.loose)."""
    at = line.find("tensor([", 0, WINDOW)
    if at < 0:
        return None
    match = _NAMED_TENSOR.search(line, max(0, at - 100), at + 420)
    if match is None:
        return None
    words = {word["word"].lower() for word in _NONFINITE.finditer(match["values"])}
    if not words & {"nan", "inf"}:
        return None
    value = "NaN" if words == {"nan"} else "Inf" if words == {"inf"} else "NaN or Inf"
    name = match["name"]
    shown = " ".join(match["values"].strip(" [").split())[:60]
    said = _P2P.get(name.rsplit(".", 1)[-1])
    detail = f"{name}: its values {shown}" + (f"; {said}" if said else "")
    return BY_ID["printed-tensor"], {"detail": detail, "value": value, "metric": name}


# a debugger's or a REPL's prompt that printed the tensor on the next line (`(Pdb++) rewards_j`: huggingface/trl#435,
# holdout18 02; `ipdb> p loss`, `>>> logits`, IPython's `In [3]: x`): the name it evaluated
_PROMPT = re.compile(
    r"^\s{0,8}(?:\((?:Pdb|Pdb\+\+|ipdb)\)|ipdb>|>>>|In \[\d{1,6}\]:)\s{1,4}(?:(?:p|pp|print)(?:\s{1,4}|\())?"
    r"(?P<name>[A-Za-z_][\w.]{0,80}(?:\[[^\]\n]{0,40}\])?)\)?\s{0,8}\Z"
)


# pdb's own commands (`(Pdb) c` runs on: the tensor after it is the program's output)
_DEBUGGER_COMMANDS = frozenset("a args b break bt c cl cont continue d down h help j l ll n next q quit r return run "
                               "s step u up unt until w where whatis display".split())  # fmt: skip


def prompt_name(before: str) -> str | None:
    """The expression a debugger or REPL prompt on the line `before` a printed tensor evaluated, if it is one."""
    match = _PROMPT.match(before[-200:]) if ("db" in before or ">>>" in before or "In [" in before) else None
    return match["name"] if match is not None and match["name"] not in _DEBUGGER_COMMANDS else None


_ASSERTS = ("probability-assert", "device-assert")  # a CUDA device-side assert: printed by the kernel, unprefixed
_NEXT_RANK = re.compile(r"\s{0,8}\[rank(?P<rank>\d{1,9})\]:")


def place_assert(hit, text: str, following: str) -> None:
    """A CUDA device-side assert's rank, where its line names none: the `[rankN]:` prefix of the traceback line right
    after it (the kernel's printf bypasses the launcher's rank prefix; the Python error it raises on that rank is
    prefixed); and where its own text starts after the progress bar it is glued to, whatever the build path before
    `Assertion` (`/pytorch/aten/...`, not only `../aten/`): launch.bars.step_at then gives its step (the bar's count
    done, the assert printed while the next step ran)."""
    if hit.signal.id not in _ASSERTS:
        return
    tag = _NEXT_RANK.match(following[:64]) if hit.rank is None else None
    if tag is not None:
        hit.rank, hit.rank_from = int(tag["rank"]), "the log prefix [rankN]: of the traceback line after it"
        hit.ranks.append(f"rank {hit.rank}: the [rank{hit.rank}]: traceback right after it")
    at = text.find("Assertion `", 0, WINDOW * 4)
    bar = last_bar(text, at) if hit.step is None and not hit.at and at > 0 else None
    if bar is not None and 0 < bar.close < at:
        hit.at = bar.close + 1
