"""The replay tracer: every aten op of a forward and backward checked, the first one to make NaN/inf named.

Modules (the package imports none of them, so the torch-free ones load without torch):
    events         what a trace reports: Event, InputFinding, TraceReport, Site, TokenMap (torch-free)
    locator        the tracer: Tracer, a dispatch mode that checks every aten op
    replay         micro-batch files, token maps, the loss replayed under the tracer
    step           one step of a real run traced on every rank, the first producer across ranks
    text           trace reports and sentinel readings in words (torch-free)
"""
