"""megatron-core's own words: the version the evidence cites and the messages its NaN checks raise.

The texts are megatron-core 0.15.0rc0's (`MCORE`), the release whose line numbers match the case's
traceback, and those of Megatron-LM's training loop at the same tag (`MEGATRON_LM`). A check's message
reaches the user inside the RerunStateMachine's error:

    RuntimeError: Rank R, node N, device D, iteration I: Unexpected result nan (message='found NaN in local
    grad norm for bucket #0 in backward pass before data-parallel communication collective')

`CHECKS` names each message's check: what it rejects (NaN, Inf, a large value), in what (the gradient, the
loss), where its text is, and whether slime's training path runs it (`check_of(message)`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MCORE = "megatron-core 0.15.0rc0"
MEGATRON_LM = "Megatron-LM core_v0.15.0rc0"  # the same tag as MCORE; the training loop slime replaces

# distributed/param_and_grad_buffer.py:188-189 and :196-197: the DDP bucket check, NaN then Inf, per bucket.
BUCKET_NONFINITE = "found {kind} in local grad norm for bucket #{bucket} in backward pass before data-parallel communication collective"
# The same check before buckets (core 0.6 to 0.9: param_and_grad_buffer.py's assertion, facts.wordings), and
# Megatron-LM's clip_grads.py before it (core 0.4, 0.5: after the data-parallel reduce, before model-parallel's).
BUCKETLESS_NAN = "found NaN in local grad norm in backward pass before data-parallel communication collective"
CLIP_NONFINITE = "found NaN in local grad norm in backwards pass"
# distributed/param_and_grad_buffer.py:207-208: the same check under --check-for-large-grads (not NaN or Inf:
# a finite norm at least 10 times the largest of the first 100, rerun_state_machine.py:649-717).
BUCKET_LARGE = (
    "found unexpected large grads in bucket #{bucket} in backward pass before data-parallel communication collective"
)
# Megatron-LM pretrain_gpt.py:254 and :261 (loss_func, under --check-for-nan-in-loss-and-grad), and :274
# (--check-for-spiky-loss): the forward loss of Megatron-LM's own training loop, which slime never runs.
LOSS_NONFINITE = "found {kind} in local forward loss calculation"
SPIKY_LOSS = "Spiky loss"
# rerun_state_machine.py:503: how validate_result words a rejected result.
UNEXPECTED_RESULT = "Unexpected result {result} (message='{message}')"


def bucket_check_pattern() -> re.Pattern:
    """The DDP bucket check's error (NaN or Inf, any bucket) at the end of a message."""
    message = re.escape(BUCKET_NONFINITE).replace(r"\{kind\}", "(?:NaN|Inf)").replace(r"\{bucket\}", r"\d+")
    text = re.escape(UNEXPECTED_RESULT).replace(r"\{result\}", "(?:nan|inf)").replace(r"\{message\}", message)
    return re.compile(text + "$")


def core_frame(path: str, line: int, function: str) -> tuple[str, int, str] | None:
    """(file basename, line, function) of a traceback frame inside megatron-core's package, else None.

    A frame's path may use either separator (a traceback pasted from Windows, or one of this process).
    """
    norm = path.replace("\\", "/")
    return (norm.rsplit("/", 1)[-1], line, function) if "/megatron/core/" in norm else None


@dataclass(frozen=True)
class Check:
    """One of Megatron's result checks, told apart by its message.

    Attributes:
        id: its one spelling (doctor's JSON `failure.check`).
        value: what it rejects: "NaN", "Inf" or "large" (finite, 10 times the largest seen).
        quantity: what it looks at: "gradient" (a bucket's local gradient norm) or "loss" (the forward loss).
        source: where its message is, "<release> <file>:<line>".
        slime: slime's training path runs it (slime drives megatron-core's DDP, never Megatron-LM's loop).
        message: its message, `#{bucket}` for the bucket index.
    """

    id: str
    value: str
    quantity: str
    source: str
    slime: bool
    message: str
    older: tuple[str, ...] = ()

    @property
    def messages(self) -> tuple[str, ...]:
        """Its message, and those of older releases (the DDP buffer's before buckets, core 0.6 to 0.9)."""
        return (self.message, *self.older)

    def matches(self, message: str, truncated: bool = False) -> bool:
        """`message` is this check's (`truncated`: cut short, a long enough start of it)."""
        return self._matches(_bucket_free(message), truncated)

    def _matches(self, text: str, truncated: bool) -> bool:
        for message in self.messages:
            if text == message:
                return True
            if truncated and len(text) >= min(len(message), 24) and message.startswith(text):
                return True
        return False


def _bucket_free(message: str) -> str:
    """`message` with its bucket index written `#{bucket}`, as the checks' messages are."""
    return re.sub(r"#\d{1,18}\b", "#{bucket}", message) if "#" in message else message


_BUFFER = f"{MCORE} distributed/param_and_grad_buffer.py"
_PRETRAIN = f"{MEGATRON_LM} pretrain_gpt.py"
CHECKS: tuple[Check, ...] = (
    Check(
        "grad-norm-nan",
        "NaN",
        "gradient",
        f"{_BUFFER}:188",
        slime=True,
        message=BUCKET_NONFINITE.replace("{kind}", "NaN"),
        older=(BUCKETLESS_NAN,),
    ),
    Check(
        "grad-norm-inf",
        "Inf",
        "gradient",
        f"{_BUFFER}:196",
        slime=True,
        message=BUCKET_NONFINITE.replace("{kind}", "Inf"),
    ),
    Check("large-grads", "large", "gradient", f"{_BUFFER}:207", slime=True, message=BUCKET_LARGE),
    Check(
        "forward-loss-nan",
        "NaN",
        "loss",
        f"{_PRETRAIN}:254",
        slime=False,
        message=LOSS_NONFINITE.replace("{kind}", "NaN"),
    ),
    Check(
        "forward-loss-inf",
        "Inf",
        "loss",
        f"{_PRETRAIN}:261",
        slime=False,
        message=LOSS_NONFINITE.replace("{kind}", "Inf"),
    ),
    Check("spiky-loss", "large", "loss", f"{_PRETRAIN}:274", slime=False, message=SPIKY_LOSS),
    Check(
        "clip-grad-norm-nan",
        "NaN",
        "gradient",
        "Megatron-LM core_v0.5.0 megatron/optimizer/clip_grads.py:104",
        slime=False,
        message=CLIP_NONFINITE,
    ),
)


BY_ID = {check.id: check for check in CHECKS}


def check_of(message: str, truncated: bool = False) -> Check | None:
    """The check whose message `message` is (None: a message of no check nanscope knows); the first of
    `checks_of` when a message cut short fits several."""
    found = checks_of(message, truncated)
    return found[0] if found else None


def checks_of(message: str, truncated: bool = False) -> list[Check]:
    """Every check whose message `message` is, or (`truncated`) starts."""
    text = _bucket_free(message)
    return [check for check in CHECKS if check._matches(text, truncated)]
