"""Find the op that first turns finite values into NaN or inf, in forward and in backward.

A `Tracer` watches every aten op of a replayed step at dispatch level (TorchDispatchMode) and
checks its outputs. An op is a *producer* when its output holds a class of non-finite value that
none of its inputs holds: NaN out of NaN-free inputs (exp(x) * 0 with x large: 0 * inf), or
+-inf out of inf-free inputs (exp(95.0)). Everything downstream of a producer only propagates,
which is what torch.autograd.detect_anomaly reports instead (it names the first backward function
whose *output* is NaN, and misses inf altogether).

Where an op sits:
  module   the innermost nn.Module running it (forward pre/post hooks on the modules you pass);
  source   the innermost Python frame outside torch and outside nanscope.trace;
  backward ops run under an autograd node (torch._C._current_autograd_node()); a TorchFunctionMode
           records, in forward, which torch function created each node (out.grad_fn), in which
           module and at which source line, so a backward producer is named e.g.
           "aten.mul.Tensor in ExpBackward0, created by exp at formulas.py:155 in approx_kl".
  token    `token_map(shape, flat_index) -> Site | None` maps an output entry to (sample, token);
           see nanscope.trace.replay.token_map for slime micro-batches.

Use (one rank, one step; all state lives and dies with the `with` block):

    with Tracer(modules=[model], token_map=tmap) as t:
        loss = loss_fn(model(x))
        loss.backward()
    report = t.report()          # TraceReport(forward=Event|None, backward=Event|None, ...)

Around megatron's forward_backward_func, call `t.microbatch(i, token_map)` in forward_step: events
then carry the micro-batch index, and backward events use the token map of the micro-batch whose
forward created their node. The phase is not declared: an op runs in backward exactly when an
autograd node is executing. The watched modules' parameters are checked on entry; non-finite ones
appear in report().inputs as "parameter <name>".

Constant non-finite arguments (masked_fill(mask, float("-inf"))) count as inputs, so intentional
masks are not producers; `allow=("aten.masked_fill",)` or a predicate silences other ops.
Collectives (c10d ops) are not checked: with async process groups their outputs are not ready at
dispatch time. Nor are ops returning uninitialised memory (empty, new_empty_strided, ...).
"""

from __future__ import annotations

import linecache
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TRACE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SKIP_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# Ops returning uninitialised memory: whatever bits they hold (NaN included) are not a result.
_UNINITIALISED = frozenset(
    (
        "empty",
        "empty_like",
        "empty_strided",
        "empty_permuted",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "resize_as_",
    )
)


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
    def from_dict(cls, d: dict) -> Event:
        """The inverse of to_dict (keys that are not fields, e.g. a rank added by a merge, are dropped)."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

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
    inputs: non-finite inputs found before the replay (see nanscope.trace.replay.scan_batch).
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
    def from_dict(cls, d: dict) -> TraceReport:
        """The inverse of to_dict."""
        ev = lambda e: None if e is None else Event.from_dict(e)  # noqa: E731
        return cls(
            ev(d["forward"]),
            ev(d["backward"]),
            d["ops_seen"],
            ev(d["first_forward"]),
            ev(d["first_backward"]),
            [InputFinding(**i) for i in d["inputs"]],
            dict(d["outcome"]),
        )

    @property
    def clean(self) -> bool:
        return self.first_forward is None and self.first_backward is None and not self.inputs

    def to_dict(self) -> dict:
        ev = lambda e: None if e is None else e.to_dict()  # noqa: E731
        return {
            "forward": ev(self.forward),
            "backward": ev(self.backward),
            "first_forward": ev(self.first_forward),
            "first_backward": ev(self.first_backward),
            "inputs": [i.to_dict() for i in self.inputs],
            "ops_seen": self.ops_seen,
            "outcome": dict(self.outcome),
        }


class _Origin(NamedTuple):
    """Where a forward torch function created an autograd node, and for which micro-batch."""

    fn: str
    module: str | None
    source: str | None
    microbatch: int | None = None
    token_map: object = None


def user_frame(skip_dirs: tuple = (_TORCH_DIR, _TRACE_DIR)):
    """The innermost Python frame whose file is outside `skip_dirs` (None if none)."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(skip_dirs) and not name.startswith("<"):
            return f
        f = f.f_back
    return None


def source_text(filename: str, lineno: int, function: str = "") -> str:
    """`nanscope/loss/formulas.py:151 in approx_kl \\`code\\``: the path from the package root when it can."""
    short = filename
    for marker in ("site-packages" + os.sep, "src" + os.sep):
        if marker in filename:
            short = filename.rsplit(marker, 1)[1]
            break
    code = linecache.getline(filename, lineno).strip()
    return f"{short}:{lineno}" + (f" in {function}" if function else "") + (f" `{code}`" if code else "")


def _frame_source() -> str | None:
    f = user_frame()
    return None if f is None else source_text(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)


def _float_tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _finite(t: torch.Tensor) -> bool:
    """Whether every entry is finite: an fp32 sum first (one fast kernel; NaN and inf propagate
    through it), the exact elementwise check only when the sum is not finite (overflow)."""
    if t.numel() == 0 or math.isfinite(t.detach().sum(dtype=torch.float32).item()):
        return True
    return bool(torch.isfinite(t).all())


def _inputs(func, args, kwargs) -> list[torch.Tensor]:
    """The float tensor inputs of an op call, without its out= buffers (their old contents are not read)."""
    outs = {a.name for a in func._schema.arguments if a.is_out}
    return _float_tensors((args, {k: v for k, v in kwargs.items() if k not in outs} if outs else kwargs))


def _classes(t: torch.Tensor) -> tuple[bool, bool]:
    """(has NaN, has +-inf) with one host sync when finite, three otherwise."""
    if _finite(t):
        return False, False
    flags = torch.stack((t.isnan().any(), t.isinf().any())).tolist()
    return bool(flags[0]), bool(flags[1])


def _counts(t: torch.Tensor) -> dict:
    c = torch.stack((t.isnan().sum(), torch.isposinf(t).sum(), torch.isneginf(t).sum())).tolist()
    return {"nan": int(c[0]), "posinf": int(c[1]), "neginf": int(c[2])}


def _summary(t: torch.Tensor, index: int, out_shape) -> str:
    """dtype[shape], finiteness, range of finite entries, the entry at `index` when shapes match."""
    dtype = str(t.dtype).replace("torch.", "")
    head = f"{dtype}{list(t.shape)}"
    if t.numel() == 0:
        return head + " empty"
    flat = t.detach().reshape(-1).float()
    finite = torch.isfinite(flat)
    c = _counts(flat)
    state = "finite" if bool(finite.all()) else ", ".join(f"{v} {k}" for k, v in c.items() if v)
    text = f"{head} {state}"
    if bool(finite.any()):
        vals = flat[finite]
        text += f", range [{float(vals.min()):.4g}, {float(vals.max()):.4g}]"
    if list(t.shape) == list(out_shape) and index < flat.numel():
        text += f", at index {index}: {float(flat[index]):.6g}"
    elif t.numel() == 1:
        text += f", value {float(flat[0]):.6g}"
    return text


def _nonfinite_params(named: list) -> list[InputFinding]:
    """InputFindings for parameters holding NaN/inf: one foreach max-abs kernel, one host sync."""
    named = [(n, p) for n, p in named if p.is_floating_point() and p.numel()]
    if not named:
        return []
    norms = torch._foreach_norm([p.detach() for _, p in named], float("inf"))
    ok = torch.isfinite(torch.stack([x.float().to(norms[0].device) for x in norms])).tolist()
    return [
        InputFinding(f"parameter {n}", _counts(p.detach().reshape(-1))) for (n, p), good in zip(named, ok) if not good
    ]


class _NodeRecorder(TorchFunctionMode):
    """Forward: remember which torch function, module and line created each autograd node."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        t = self.tracer
        if torch._C._current_autograd_node() is not None:
            return out
        nodes = t._nodes
        for x in tree_leaves(args):  # nodes made by custom autograd.Functions: first use
            if isinstance(x, torch.Tensor) and x.grad_fn is not None and x.grad_fn not in nodes:
                nodes[x.grad_fn] = _Origin(
                    type(x.grad_fn).__name__ + " (custom Function; first used here)",
                    t._module(),
                    _frame_source(),
                    t._mb,
                    t.token_map,
                )
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor) and x.grad_fn is not None and x.grad_fn not in nodes:
                nodes[x.grad_fn] = _Origin(
                    getattr(func, "__name__", str(func)), t._module(), _frame_source(), t._mb, t.token_map
                )
        return out


class _OpChecker(TorchDispatchMode):
    """Every aten op: run it, check its outputs, classify producer vs propagator."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = self.tracer
        t.ops_seen += 1
        phase = "backward" if torch._C._current_autograd_node() is not None else "forward"
        if t._done(phase) or func.namespace in _SKIP_NAMESPACES or func._opname in _UNINITIALISED:
            return func(*args, **kwargs)
        before = None
        if func._schema.is_mutable:  # in-place: classify the inputs before they are overwritten
            before = [_classes(x) for x in _inputs(func, args, kwargs)]
        out = func(*args, **kwargs)
        outs = _float_tensors(out)
        if not outs:
            return out
        bad = [o for o in outs if not _finite(o)]
        if bad:
            t._on_nonfinite(func, phase, bad[0], args, kwargs, before)
        return out


class Tracer:
    """Context manager: trace one step and report the first non-finite producer per phase.

    Args:
        modules: nn.Modules whose forward hooks give the module path (model chunks; names from
            named_modules(), prefixed "chunk<i>." when more than one is given).
        token_map: (shape, flat_index) -> Site | None, for sample/token positions.
        allow: op names (prefix match on "aten.masked_fill" etc.) or a predicate
            `allow(op_name: str, module: str | None) -> bool`; allowed ops are never producers.
    """

    def __init__(self, modules=(), token_map: TokenMap | None = None, allow=()):
        self.modules = list(modules)
        self.token_map = token_map
        self._mb: int | None = None
        self.allow = allow
        self.ops_seen = 0
        self.events: dict[str, Event] = {}  # "forward"/"backward"/"first_forward"/"first_backward"
        self._nodes: dict = {}  # autograd node -> _Origin (strong refs; released on exit)
        self._stack: list[str] = []
        self._handles: list = []
        self._params: dict = {}  # id(param) -> "module.param"
        self._bad_params: list = []
        self._modes = (_NodeRecorder(self), _OpChecker(self))

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Tracer:
        many = len(self.modules) > 1
        for i, root in enumerate(self.modules):
            prefix = f"chunk{i}." if many else ""
            for name, m in root.named_modules():
                path = (prefix + name).rstrip(".")
                self._handles.append(m.register_forward_pre_hook(self._push(path)))
                self._handles.append(m.register_forward_hook(self._pop(path), always_call=True))
            for name, p in root.named_parameters():
                self._params[id(p)] = prefix + name
        self._bad_params = _nonfinite_params(
            [(self._params[id(p)], p) for root in self.modules for p in root.parameters()]
        )
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._nodes.clear()
        self._stack.clear()

    def microbatch(self, index: int, token_map: TokenMap | None = None) -> None:
        """Mark the start of micro-batch `index` (e.g. in megatron's forward_step) and set its token
        map. Backward events use the micro-batch and token map their node was created under, so
        pipelined schedules (1F1B) that run backward passes later are mapped correctly."""
        self._mb = index
        if token_map is not None:
            self.token_map = token_map

    def report(self, inputs: list | None = None) -> TraceReport:
        """The trace so far. `inputs`: non-finite inputs found before the replay (batch keys); the
        watched modules' non-finite parameters (checked on entry) are added as "parameter <name>"."""
        e = self.events
        found = list(inputs or []) + self._bad_params
        return TraceReport(
            e.get("forward"), e.get("backward"), self.ops_seen, e.get("first_forward"), e.get("first_backward"), found
        )

    # -- module stack ----------------------------------------------------------------------
    def _push(self, path: str):
        def hook(module, args):
            self._stack.append(path)

        return hook

    def _pop(self, path: str):
        def hook(module, args, output):
            if self._stack and self._stack[-1] == path:
                self._stack.pop()

        return hook

    def _module(self) -> str | None:
        return self._stack[-1] if self._stack else None

    # -- classification --------------------------------------------------------------------
    def _done(self, phase: str) -> bool:
        return phase in self.events and ("first_" + phase) in self.events

    def _allowed(self, op: str, module: str | None) -> bool:
        if callable(self.allow):
            return bool(self.allow(op, module))
        return any(op == a or op.startswith(a + ".") for a in self.allow)

    def _on_nonfinite(self, func, phase, out: torch.Tensor, args, kwargs, before) -> None:
        ins = _inputs(func, args, kwargs)
        classes = before if before is not None else [_classes(x) for x in ins]
        in_nan = any(n for n, _ in classes)
        in_inf = any(i for _, i in classes)
        for s in tree_leaves((args, kwargs)):  # constant arguments: masked_fill(m, -inf) is intentional
            if isinstance(s, float) and not (s == s and abs(s) != float("inf")):
                in_nan |= s != s
                in_inf |= s == s
        flat = out.detach().reshape(-1)
        counts = _counts(flat)
        produced = []
        if counts["nan"] and not in_nan:
            produced.append("nan")
        if (counts["posinf"] or counts["neginf"]) and not in_inf:
            produced.append("inf")
        op = str(func)
        allowed = bool(produced) and self._allowed(op, self._where(phase)[0])
        is_producer = bool(produced) and not allowed
        keys = [k for k, wanted in ((phase, is_producer), ("first_" + phase, True)) if wanted and k not in self.events]
        if keys:
            ev = self._event(op, phase, flat, out.shape, counts, produced, ins)
            ev.allowed = allowed
            for k in keys:
                self.events[k] = ev

    def _where(self, phase: str) -> tuple:
        """(module, source, node name, created_by, micro-batch, token map) of the op running now."""
        if phase == "forward":
            return self._module(), _frame_source(), None, None, self._mb, self.token_map
        node = torch._C._current_autograd_node()
        name = node.name()
        origin = self._nodes.get(node)
        if origin is not None:
            return origin.module, origin.source, name, origin.fn, origin.microbatch, origin.token_map
        variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter it accumulates into
        if variable is not None and id(variable) in self._params:
            pname = self._params[id(variable)]
            return pname.rpartition(".")[0], None, name, f"parameter {pname}", None, None
        return None, _frame_source(), name, None, None, self.token_map

    def _event(self, op, phase, flat, shape, counts, produced, ins) -> Event:
        if "nan" in produced or (not produced and counts["nan"]):
            bad = flat.isnan()
        else:
            bad = torch.isinf(flat) if flat.is_floating_point() else ~torch.isfinite(flat)
        first = int(bad.nonzero()[0, 0])
        module, source, node, created_by, mb, tmap = self._where(phase)
        ev = Event(
            op,
            phase,
            module,
            source,
            counts,
            first,
            list(shape),
            node=node,
            created_by=created_by,
            input_summary=[_summary(x, first, shape) for x in ins],
            index=self.ops_seen,
            produced="+".join(produced),
            microbatch=mb,
        )
        site = tmap(tuple(shape), first) if tmap is not None else None
        if site is not None:
            site = Site(*site)  # a plain (sample, token) tuple works too
            ev.sample, ev.token, ev.axis, ev.masked = site.sample, site.token, site.axis, site.masked
        return ev
