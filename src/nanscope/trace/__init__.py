"""Locate the first NaN/inf: a replay tracer (which op, module, line, token) and an always-on sentinel.

    from nanscope.trace import replay
    from nanscope.trace.locator import Tracer
    from nanscope.trace.sentinel import Sentinel

    # Replay (every aten op checked; a few times slower than the step):
    with Tracer(modules=[model], token_map=replay.token_map(batch)) as t:
        loss_fn(model(x)).backward()
    t.report().forward          # Event: op, module, source line, sample, token (None: no producer)

    # Training (on-device flags, no host sync in any hook):
    sentinel = Sentinel([model])
    ...                         # forward/backward of the step's micro-batches
    reading = sentinel.read(grads=True)   # ONE host sync: first non-finite module in forward and
                                          # backward order, with its micro-batch

Modules (the package imports none of them, so the torch-free ones load without torch):
    events         what a trace reports: Event, InputFinding, TraceReport, Site, TokenMap (torch-free)
    locator        the tracer: Tracer, a dispatch mode that checks every aten op
    replay         micro-batch files, token maps, the loss replayed under the tracer
      torch_file     every torch.load(weights_only=True) of a user's file, bounded by what was read
      pickle_budget  what a pickle may build: 8 bytes a byte of its file + 32 MiB (torch-free)
    step           one step of a real run traced on every rank, the first producer across ranks
    bundle         the repro bundle a rank writes on a non-finite step (the format)
      bundle_load    a bundle read within torch_file's bounds, every field checked
      bundle_replay  its loss replayed offline from the recorded log-probs, then through the guard
      bundle_rows    which rollout-dump row each of its samples is (torch-free)
      bundle_text    a replayed bundle in words, one line per rank for a directory (torch-free)
      slime_import   a slime checkout's loss imported off the cluster (stand-ins), megatron's parallel state
    reading        what the sentinel read: Reading, Hit, Producer (torch-free)
    sentinel       the Sentinel, composed of
      slots          the on-device flags of one phase (a float32 sum per check)
      call_layers    a check installed as a layer of a module's call
      output_checks  the check of every module output (and of the gradients arriving there)
      grad_screens   parameter-gradient arrival order, per-backward-call screens, check_grads
    classify       a reading (and what the loss saw) -> a class of cause (torch-free)
    observe        a reading in public module names, loss-input counts (torch-free at import)
    text           reports and readings in words (torch-free)
"""
