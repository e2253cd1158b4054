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
           see nanscope.trace.tracer.replay.token_map for slime micro-batches.

Use (one rank, one step; all state lives and dies with the `with` block):

    with Tracer(modules=[model], token_map=tmap) as t:
        loss = loss_fn(model(x))
        loss.backward()
    report = t.report()          # TraceReport(forward=Event|None, backward=Event|None, ...): trace.tracer.events

Around megatron's forward_backward_func, call `t.microbatch(i, token_map)` in forward_step: events
then carry the micro-batch index, and backward events use the token map of the micro-batch whose
forward created their node. The phase is not declared: an op runs in backward exactly when an
autograd node is executing. The watched modules' parameters are checked on entry; non-finite ones
appear in report().inputs as "parameter <name>".

Constant non-finite arguments (masked_fill(mask, float("-inf"))) count as inputs, so intentional
masks are not producers; `allow=("aten.masked_fill",)` or a predicate silences other ops.
Collectives (c10d ops) are not checked: with async process groups their outputs are not ready at
dispatch time. Nor are ops returning uninitialised memory (empty, new_empty_strided, ...), nor views
(slice, view, t, ...): a view computes nothing, its values are another tensor's, and megatron's attention
takes a view of a buffer that torch.empty made and nothing ever writes (megatron-core 0.15.0rc0
transformer/dot_product_attention.py:156-161, baddbmm with beta=0 ignores it), garbage NaN included.
"""

from __future__ import annotations

import linecache
import math
import os
import sys
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from nanscope.trace.tracer.events import Event, InputFinding, Site, TokenMap, TraceReport

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


class _Origin(NamedTuple):
    """Where a forward torch function created an autograd node, and for which micro-batch."""

    fn: str
    module: str | None
    source: str | None
    microbatch: int | None = None
    token_map: object = None


def user_frame(skip_dirs: tuple = (_TORCH_DIR, _TRACE_DIR)):
    """The innermost Python frame whose file is outside `skip_dirs` (None if none)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip_dirs) and not name.startswith("<"):
            return frame
        frame = frame.f_back
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
    frame = user_frame()
    return None if frame is None else source_text(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _float_tensors(tree) -> list[torch.Tensor]:
    """The floating-point tensors holding values (not `meta` ones: a nested tensor's backward computes shapes there)."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.is_meta]


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
    counts = torch.stack((t.isnan().sum(), torch.isposinf(t).sum(), torch.isneginf(t).sum())).tolist()
    return {"nan": int(counts[0]), "posinf": int(counts[1]), "neginf": int(counts[2])}


def _summary(t: torch.Tensor, index: int, out_shape) -> str:
    """dtype[shape], finiteness, range of finite entries, the entry at `index` when shapes match."""
    dtype = str(t.dtype).replace("torch.", "")
    head = f"{dtype}{list(t.shape)}"
    if t.numel() == 0:
        return head + " empty"
    flat = t.detach().reshape(-1).float()
    finite = torch.isfinite(flat)
    counts = _counts(flat)
    state = "finite" if bool(finite.all()) else ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    text = f"{head} {state}"
    if bool(finite.any()):
        finite_values = flat[finite]
        text += f", range [{float(finite_values.min()):.4g}, {float(finite_values.max()):.4g}]"
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
        tracer = self.tracer
        if torch._C._current_autograd_node() is not None:
            return out
        nodes = tracer._nodes
        for x in tree_leaves(args):  # nodes made by custom autograd.Functions: first use
            if isinstance(x, torch.Tensor) and x.grad_fn is not None and x.grad_fn not in nodes:
                nodes[x.grad_fn] = _Origin(
                    type(x.grad_fn).__name__ + " (custom Function; first used here)",
                    tracer._module(),
                    _frame_source(),
                    tracer._mb,
                    tracer.token_map,
                )
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor) and x.grad_fn is not None and x.grad_fn not in nodes:
                nodes[x.grad_fn] = _Origin(
                    getattr(func, "__name__", str(func)),
                    tracer._module(),
                    _frame_source(),
                    tracer._mb,
                    tracer.token_map,
                )
        return out


class _OpChecker(TorchDispatchMode):
    """Every aten op: run it, check its outputs, classify producer vs propagator."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tracer = self.tracer
        tracer.ops_seen += 1
        phase = "backward" if torch._C._current_autograd_node() is not None else "forward"
        if tracer._done(phase) or func.namespace in _SKIP_NAMESPACES or func._opname in _UNINITIALISED or func.is_view:
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
            tracer._on_nonfinite(func, phase, bad[0], args=args, kwargs=kwargs, before=before)
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
        for chunk, root in enumerate(self.modules):
            prefix = f"chunk{chunk}." if many else ""
            for name, module in root.named_modules():
                path = (prefix + name).rstrip(".")
                self._handles.append(module.register_forward_pre_hook(self._push(path)))
                self._handles.append(module.register_forward_hook(self._pop(path), always_call=True))
            for name, param in root.named_parameters():
                self._params[id(param)] = prefix + name
        self._bad_params = _nonfinite_params(
            [(self._params[id(param)], param) for root in self.modules for param in root.parameters()]
        )
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
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
        events = self.events
        return TraceReport(
            forward=events.get("forward"),
            backward=events.get("backward"),
            ops_seen=self.ops_seen,
            first_forward=events.get("first_forward"),
            first_backward=events.get("first_backward"),
            inputs=list(inputs or []) + self._bad_params,
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

    def _on_nonfinite(self, func, phase: str, out: torch.Tensor, *, args, kwargs, before) -> None:
        inputs = _inputs(func, args, kwargs)
        classes = before if before is not None else [_classes(x) for x in inputs]
        in_nan = any(has_nan for has_nan, _ in classes)
        in_inf = any(has_inf for _, has_inf in classes)
        for constant in tree_leaves((args, kwargs)):  # constant arguments: masked_fill(m, -inf) is intentional
            if isinstance(constant, float) and not (constant == constant and abs(constant) != float("inf")):
                in_nan |= constant != constant
                in_inf |= constant == constant
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
        wanted = ((phase, is_producer), ("first_" + phase, True))
        keys = [key for key, wants in wanted if wants and key not in self.events]
        if keys:
            event = self._event(op, phase, flat, shape=out.shape, counts=counts, produced=produced, inputs=inputs)
            event.allowed = allowed
            for key in keys:
                self.events[key] = event

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
            param = self._params[id(variable)]
            return param.rpartition(".")[0], None, name, f"parameter {param}", None, None
        return None, _frame_source(), name, None, None, self.token_map

    def _event(self, op: str, phase: str, flat: torch.Tensor, *, shape, counts: dict, produced: list, inputs) -> Event:
        """The event of an op whose output (flattened: `flat`) is non-finite, with its inputs' summaries."""
        if "nan" in produced or (not produced and counts["nan"]):
            bad = flat.isnan()
        else:
            bad = torch.isinf(flat) if flat.is_floating_point() else ~torch.isfinite(flat)
        first = int(bad.nonzero()[0, 0])
        module, source, node, created_by, microbatch, token_map = self._where(phase)
        event = Event(
            op=op,
            phase=phase,
            module=module,
            source=source,
            nonfinite=counts,
            first_index=first,
            shape=list(shape),
            node=node,
            created_by=created_by,
            input_summary=[_summary(x, first, shape) for x in inputs],
            index=self.ops_seen,
            produced="+".join(produced),
            microbatch=microbatch,
        )
        site = token_map(tuple(shape), first) if token_map is not None else None
        if site is not None:
            site = Site(*site)  # a plain (sample, token) tuple works too
            event.sample, event.token, event.axis, event.masked = site.sample, site.token, site.axis, site.masked
        return event
