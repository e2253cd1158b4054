"""Locate the first NaN/inf: a replay tracer (which op, module, line, token) and an always-on sentinel.

    from nanscope.trace import Sentinel, Tracer, replay

    # Replay (every aten op checked; a few times slower than the step):
    with Tracer(modules=[model], token_map=replay.token_map(batch)) as t:
        loss_fn(model(x)).backward()
    t.report().forward          # Event: op, module, source line, sample, token (None: no producer)

    # Training (on-device flags, no host sync in any hook):
    sentinel = Sentinel([model])
    ...                         # forward/backward of the step's micro-batches
    reading = sentinel.read(grads=True)   # ONE host sync: first non-finite module in forward and
                                          # backward order, with its micro-batch

Modules: locator (Tracer, Event, TraceReport), sentinel (Sentinel, Reading, Hit, check_grads),
replay (micro-batch files, token maps, hazard replays). Rendering: nanscope.report.trace.
"""

from nanscope.trace.locator import Event, InputFinding, Site, Tracer, TraceReport
from nanscope.trace.sentinel import Hit, Reading, Sentinel, check_grads

__all__ = ["Event", "Hit", "InputFinding", "Reading", "Sentinel", "Site", "TraceReport", "Tracer", "check_grads"]
