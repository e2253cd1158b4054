"""Locate the first NaN/inf: a replay tracer (which op, module, line, token) and an always-on sentinel.

    from nanscope.trace import Tracer, Sentinel
    with Tracer(modules=[model], token_map=replay.token_map(batch)) as t:   # replay: every aten op
        loss_fn(model(x)).backward()
    t.report().forward          # Event: op, module, source line, sample, token

    sentinel = Sentinel([model])                                            # training: on-device flags
    ... forward/backward of the step's micro-batches ...
    reading = sentinel.read()   # one host sync: first non-finite module in forward and backward order

See locator (Tracer), sentinel (Sentinel), replay (micro-batch files, token maps), render (text).
"""

from nanscope.trace.locator import Event, InputFinding, Site, TraceReport, Tracer
from nanscope.trace.sentinel import Hit, Reading, Sentinel

__all__ = ["Event", "Hit", "InputFinding", "Reading", "Sentinel", "Site", "TraceReport", "Tracer"]
