"""Lines that say in words that a value went non-finite, where no `key: nan` value is printed (launch.signals calls
these by their literal anchors):

    3/234 [......] - ETA: 33:37:24 - loss: 44.4110Batch 3: Invalid loss, terminating training     Keras TerminateOnNaN
    {"simapp_exception": {..., "message": "NaN detected in loss function, aborting training. Job failed!", ...}}
                                                                       a JSON log record whose message says so
        sampling_per_token_logps = [torch.tensor(logps) for logps in sampling_per_token_logps_list]
    RuntimeError: Could not infer dtype of NoneType              TRL's None for vLLM's NaN log-prob (the line before)

Each regex is applied to a bounded window after its literal anchor, with bounded repeats only: linear in the line.

    read = terminate_on_nan(text, before)    # (signal, fields) of Keras's TerminateOnNaN line, or None
    read = json_message(text, before)        # ... of a JSON record whose "message" names NaN or Inf, or None
    read = none_logprob(text, before)        # ... of torch.tensor's None error under TRL's sampling log-probs' line
"""

from __future__ import annotations

import re

from nanscope.facts.signals import BY_ID, WORDING, Signal

WINDOW = 2048  # characters read
TERMINATE_ANCHOR = "Invalid loss, terminating training"
MESSAGE_ANCHOR = '"message": "'
# keras TerminateOnNaN.on_batch_end (keras-team/keras keras/src/callbacks/terminate_on_nan.py: print_msg(f"Batch
# {batch}: Invalid loss, terminating training"), where the loss is NaN or Inf; keras 2 keras/callbacks.py:
# print('Batch %d: Invalid loss, terminating training' % (batch))); glued after the progress bar it interrupts. The
# batch is the 0-based index the fit loop passes to on_batch_end (tf.keras 1.x training_arrays.py fit_loop: `for
# batch_index, (batch_start, batch_end) in enumerate(batches)` ... `callbacks.on_batch_end(batch_index, batch_logs)`),
# while the Progbar counts the batches seen: `Batch 3` is the bar's 4/N (holdout10 12: `3/234 ... loss: 44.4110`,
# finite, then `Batch 3: Invalid loss`, then `4/234 ... loss: inf`)
_TERMINATE = re.compile(r"Batch (?P<batch>\d{1,12}): Invalid loss, terminating training")
# a JSON string value under "message" (escaped quotes allowed), up to 400 characters
DIVERGED_ANCHOR = "Model diverged with loss"
# torch.tensor on a list holding None (`Could not infer dtype of NoneType`) under TRL's GRPO trainer's line building
# the sampling log-probs' tensors: TRL writes vLLM's NaN log-prob as None (facts.signals: none-logprob; huggingface/
# trl#6166, holdout26 02)
NONE_ANCHOR = "Could not infer dtype of NoneType"
_SAMPLING_LOGPS = re.compile(r"\bsampling_per_token_logps\s{0,4}=\s{0,4}\[\s{0,4}torch\.tensor\(")
JSON_FLOAT_ANCHOR = "float values are not JSON compliant"
# Python's json with allow_nan=False (FastAPI's and Starlette's responses): CPython 3.11 Lib/json/encoder.py:240-242
# adds the value's repr, its C encoder (the default) none
_JSON_FLOAT = re.compile(r"Out of range float values are not JSON compliant(?::\s{0,2}(?P<value>-?(?:nan|inf)))?")
_DIVERGED = re.compile(r"Model diverged with loss = NaN")
_MESSAGE = re.compile(r'"message": "(?P<msg>(?:[^"\\\n]|\\.){1,400})"')
_NONFINITE = re.compile(r"(?<![A-Za-z])(?P<word>nan|inf|infinity|non-?finite|not finite)(?![A-Za-z])", re.IGNORECASE)
_SAYING = re.compile(
    r"(?<![A-Za-z])(?:detected|found|encountered|occurred|occurs|became|becomes|is|are|was|were|got)(?![A-Za-z])",
    re.IGNORECASE,
)
_KIND = re.compile(r'"(?P<key>[a-z_]{0,60}(?:exception|error)[a-z_]{0,20})": ', re.IGNORECASE)  # `"simapp_exception": `
_FAILED = ("exception", "error", "abort", "failed", "fatal", "terminat")
_WHAT = re.compile(
    r"\b(?P<what>loss|gradients?|grad(?:_| )norm|weights?|logits|rewards?|value function)\b", re.IGNORECASE
)


# what a message says is not finite (`Loss is not finite`, `total norm ... for gradients ... is non-finite`)
_SUBJECT = re.compile(
    r"(?<![\w./-])(?P<key>loss|grad_norm|total norm|gradients?|weights?|logits)\b[^\n]{0,60}?"
    r"\b(?:is|are|was|were|became)\s{1,4}(?:not finite|non-?finite)",
    re.IGNORECASE,
)


def none_logprob(text: str, before: str) -> tuple[Signal, dict] | None:
    """torch.tensor's `Could not infer dtype of NoneType` right under TRL's code line that builds the sampling
    log-probs' tensors: a NaN log-prob from vLLM, written as None (facts.signals: none-logprob); None elsewhere (a
    None in any other list names no NaN)."""
    if _SAMPLING_LOGPS.search(before[-300:]) is None:
        return None
    return BY_ID["none-logprob"], {
        "op": "torch.tensor(logps)",
        "metric": "sampling_per_token_logps",
        "wording": WORDING["trl-none-logprob"],
        "value": "NaN",
    }


def subject(message: str) -> str | None:
    """What an error's message says is not finite (`Loss is not finite and patience is exhausted`: loss), or None."""
    match = _SUBJECT.search(message, 0, WINDOW)
    if match is None:
        return None
    key = match["key"].lower()
    return "grad_norm" if key in ("total norm", "grad_norm") else key


def terminate_on_nan(text: str, before: str = "") -> tuple[Signal, dict] | None:
    """Keras's TerminateOnNaN: the loss of batch N (its index within the epoch) was NaN or Inf; training stops after
    it (gracefully: no error follows)."""
    match = _TERMINATE.search(text, 0, WINDOW)
    if match is None:
        return None
    batch = int(match["batch"])  # Keras's 0-based batch index: the progress bar counts that batch as batch + 1
    return BY_ID["nonfinite-message"], {
        "op": "TerminateOnNaN",
        "detail": f"Keras's TerminateOnNaN: the loss of batch index {batch} is NaN or Inf; training stopped",
        "metric": "loss",
        "value": "NaN or Inf",
        "step": batch + 1,
        "step_from": f"TerminateOnNaN's `Batch {batch}`: Keras's 0-based index of the batch within its epoch, "
        f"the progress bar's {batch + 1}/...",
    }


def diverged(text: str, before: str = "") -> tuple[Signal, dict] | None:
    """TensorFlow's NanTensorHook: `Model diverged with loss = NaN.`, logged at ERROR before it raises
    NanLossDuringTrainingError (fail_on_nan_loss, its default: tensorflow/python/training/basic_session_run_hooks.py,
    NanTensorHook.after_run) and ends the run."""
    if _DIVERGED.search(text, 0, WINDOW) is None:
        return None
    return BY_ID["nonfinite-error"], {
        "op": "NanTensorHook",
        "detail": "TensorFlow's NanTensorHook: the loss is NaN; it raises NanLossDuringTrainingError and training stops",
        "metric": "loss",
        "value": "NaN",
    }


def json_float(text: str, before: str = "") -> tuple[Signal, dict] | None:
    """A JSON encoder refusing a NaN or an Inf (`ValueError: Out of range float values are not JSON compliant`): a
    value the process serialised (a server's response, a metric, a record) was non-finite (THUDM/slime#1790, holdout17
    13: SGLang's rollout server answered 503)."""
    match = _JSON_FLOAT.search(text, 0, WINDOW)
    if match is None:
        return None
    value = {"nan": "NaN", "inf": "Inf", "-inf": "Inf"}.get(match["value"] or "", "NaN or Inf")
    return BY_ID["nonfinite-error"], {
        "op": "json (allow_nan=False)",
        "detail": "a JSON encoder refused a NaN or Inf float: a value the process serialised (a server's response, a "
        "metric, a record) was non-finite",
        "value": value,
    }


def json_message(text: str, before: str = "") -> tuple[Signal, dict] | None:
    """A JSON record whose "message" says a NaN or an Inf was met (`NaN detected in loss function, aborting
    training`): an error where the record or the message says it failed or aborted, else a message."""
    match = _MESSAGE.search(text, 0, WINDOW)
    if match is None:
        return None
    message = match["msg"]
    words = {word["word"].lower() for word in _NONFINITE.finditer(message)}
    if not words or _SAYING.search(message) is None:
        return None
    value = "NaN" if words == {"nan"} else "Inf" if words <= {"inf", "infinity"} else "NaN or Inf"
    low = text[:WINDOW].lower()
    what = _WHAT.search(message)
    fields = {"detail": f"a JSON log record's message: {message[:200]}", "value": value}
    if what is not None:
        fields["metric"] = what["what"].lower()
    if any(word in low for word in _FAILED):
        kind = _KIND.search(text, 0, WINDOW)
        return BY_ID["nonfinite-error"], {**fields, "op": kind["key"] if kind is not None else "message"}
    return BY_ID["nonfinite-message"], fields
