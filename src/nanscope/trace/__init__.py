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
replay (micro-batch files, token maps, hazard replays); their names are imported here at first use.
Rendering: nanscope.trace.text.
"""

import importlib

# name -> its module; imported at first use, so that `nanscope.trace.classify` (pure) does not import torch
_EXPORTS = {
    **dict.fromkeys(("Event", "InputFinding", "Site", "Tracer", "TraceReport"), "nanscope.trace.locator"),
    **dict.fromkeys(("Hit", "Reading", "Sentinel", "check_grads"), "nanscope.trace.sentinel"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
