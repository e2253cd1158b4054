"""Locate the first NaN/inf: a replay tracer (which op, module, line, token) and an always-on sentinel.

    from nanscope.trace.tracer import replay
    from nanscope.trace.tracer.locator import Tracer
    from nanscope.trace.sentinels.sentinel import Sentinel

    # Replay (every aten op checked; a few times slower than the step):
    with Tracer(modules=[model], token_map=replay.token_map(batch)) as t:
        loss_fn(model(x)).backward()
    t.report().forward          # Event: op, module, source line, sample, token (None: no producer)

    # Training (on-device flags, no host sync in any hook):
    sentinel = Sentinel([model])
    ...                         # forward/backward of the step's micro-batches
    reading = sentinel.read(grads=True)   # ONE host sync: first non-finite module in forward and
                                          # backward order, with its micro-batch

One subpackage a concept (no package imports its modules, so the torch-free ones load without torch):
    sentinels/   the always-on sentinel: on-device flags on every training step, what it read, its class of cause
    tracer/      the replay tracer: every aten op checked, a micro-batch replayed, a step traced on every rank
    bundles/     the repro bundle a rank writes on a non-finite step, read and replayed offline
    loading/     every torch.load(weights_only=True) of a user's file, bounded (micro-batch files, bundles, dumps)

The modules at this level (bundle, classify, locator, replay, sentinel, step, torch_file) hold no code: they
keep the paths the README and code written before the subpackages import, re-exporting the new homes.
"""
