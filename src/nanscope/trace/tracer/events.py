"""What a traced step reports: the ops with a non-finite output (`Event`), the non-finite inputs no op
produced (`InputFinding`), both phases together (`TraceReport`, with its JSON form), and where a flat index
of a tensor sits in the micro-batch (`Site`, given by a `TokenMap`).

Torch-free: the reports and the cross-rank merge read these without the tracer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import NamedTuple


class Site(NamedTuple):
    """Where a flat index of a tensor sits in the micro-batch.

    axis: "response" (token = 0-based position in the sample's response) or "sequence" (token =
    0-based position in the sample's whole sequence, prompt included). masked: the loss mask of
    that response token is 0 (None when it has none, e.g. a prompt position).
    """

    sample: int
    token: int
    axis: str = "response"
    masked: bool | None = None


TokenMap = Callable[[tuple, int], "Site | None"]


@dataclass
class Event:
    """One op with a non-finite output.

    op: aten overload, e.g. "aten.exp.default". phase: "forward" or "backward".
    module: module path (named_modules names; "" is the root), None outside every watched module.
    source: "path.py:LINE `code`" of the innermost user frame (backward: where the autograd node
        was created in forward). node: backward only, the autograd node, e.g. "ExpBackward0".
    created_by: backward only, the torch function that created the node in forward.
    nonfinite: counts in the output {"nan", "posinf", "neginf"}. first_index: flat index of the first
        non-finite entry of the produced class. shape: output shape.
    sample, token, axis, masked: from the token map (None when it does not apply).
    input_summary: one line per tensor input (dtype, shape, finiteness, range, value at first_index).
    index: ordinal of the op among all ops seen (forward and backward together).
    produced: "nan", "inf" or "nan+inf": the class(es) no input had; "" for a propagator.
    allowed: a producer the allow-list exempts (only ever a first_forward/first_backward event).
    microbatch: the micro-batch set with Tracer.microbatch() (backward: the one whose forward
        created the node), None if never set; sample/token are within that micro-batch.
    """

    op: str
    phase: str
    module: str | None
    source: str | None
    nonfinite: dict
    first_index: int
    shape: list
    sample: int | None = None
    token: int | None = None
    axis: str | None = None
    masked: bool | None = None
    node: str | None = None
    created_by: str | None = None
    input_summary: list = field(default_factory=list)
    index: int = 0
    produced: str = ""
    microbatch: int | None = None
    allowed: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Event:
        """The inverse of to_dict (keys that are not fields, e.g. a rank added by a merge, are dropped)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def where(self) -> str:
        """ "module M, source S" in words."""
        parts = []
        if self.node:
            parts.append(f"in {self.node}" + (f" (created by {self.created_by})" if self.created_by else ""))
        parts.append(f"module {self.module!r}" if self.module is not None else "outside the watched modules")
        if self.source:
            parts.append(f"at {self.source}")
        return ", ".join(parts)

    def token_text(self) -> str:
        if self.sample is None:
            return "no token position (not a per-token tensor)"
        what = "response token" if self.axis == "response" else "sequence position"
        mask = "" if self.masked is None else (", loss_mask 0 (masked)" if self.masked else ", loss_mask 1")
        return f"sample {self.sample}, {what} {self.token}{mask}"


@dataclass
class InputFinding:
    """A non-finite value that no op produced: it was in an input tensor before the step ran.

    name: the input's name (a batch key). sample/token: of its first non-finite entry.
    """

    name: str
    nonfinite: dict
    sample: int | None = None
    token: int | None = None
    masked: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TraceReport:
    """What a traced step did.

    forward/backward: the first producer in each phase (None: no op produced a non-finite value).
    first_forward/first_backward: the first op with any non-finite output, producer or not: when
        it comes before the producer (or there is none), the non-finite value came from an input.
    inputs: non-finite inputs found before the replay (see nanscope.trace.tracer.replay.scan_batch).
    ops_seen: aten ops dispatched while tracing.
    outcome: what the traced step gave, filled by the caller (replay: loss value, loss_finite,
        grad_nonfinite = non-finite entries of d loss / d logits).
    """

    forward: Event | None
    backward: Event | None
    ops_seen: int
    first_forward: Event | None = None
    first_backward: Event | None = None
    inputs: list = field(default_factory=list)
    outcome: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> TraceReport:
        """The inverse of to_dict."""
        event = lambda record: None if record is None else Event.from_dict(record)  # noqa: E731
        return cls(
            forward=event(data["forward"]),
            backward=event(data["backward"]),
            ops_seen=data["ops_seen"],
            first_forward=event(data["first_forward"]),
            first_backward=event(data["first_backward"]),
            inputs=[InputFinding(**finding) for finding in data["inputs"]],
            outcome=dict(data["outcome"]),
        )

    @property
    def clean(self) -> bool:
        return self.first_forward is None and self.first_backward is None and not self.inputs

    def to_dict(self) -> dict:
        record = lambda event: None if event is None else event.to_dict()  # noqa: E731
        return {
            "forward": record(self.forward),
            "backward": record(self.backward),
            "first_forward": record(self.first_forward),
            "first_backward": record(self.first_backward),
            "inputs": [finding.to_dict() for finding in self.inputs],
            "ops_seen": self.ops_seen,
            "outcome": dict(self.outcome),
        }
