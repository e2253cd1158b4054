"""nanscope: find, reproduce and fix NaN in Megatron-based RL runs (slime GRPO), on a laptop CPU.

The package is layered; every import points down (pyproject's [tool.importlinter] contracts, run by CI):

    L5 entry points  cli/ (one module per command), report/ (one renderer per command), repro.py,
                     equivalence.py, case.py (the bundled case, read once here and passed down as values)
    L4 runtimes      megatron/ (the CPU harness: launcher, worker, run, step, cpu patches), slime_plugin/
                     (inside a real slime run: the loss, the hook, one installation per process)
    L3 readers and   launch/ (a launch script, statically), dumps/ (slime's dumps, restricted loader),
       builders      hazards.py (case-shaped hazard batches)
    L2 mechanisms    trace/ (sentinels/: the sentinel and classify; tracer/: the tracer and replay; bundles/: the
                     repro bundle; loading/: bounded torch.load), loss/ (formulas, layout, slime v0.1.0's
                     loss as-is, the guard that makes any release's loss NaN-safe, the fix)
    L1 facts         causes/ (the catalogue as data), facts/ (slime's releases and flags, batch keys,
                     fp32 limits, megatron-core's messages): torch-free, no file reads
    L0               errors.py, inputs.py

Data flow, one line per command:
    repro    case (flags) -> hazards -> megatron/launcher -> worker/run/step on torchrun ranks -> spec
             records -> repro -> report/repro
    hazards  case (flags) -> hazards.run_loss on a synthetic policy -> loss -> report/hazards
    doctor   launch/script (bounded static bash) -> config -> topology, findings, candidates -> report/doctor
    scan     dumps/io (restricted loader, streamed samples) -> dumps/checks -> report/scan
    trace    trace/tracer/ replay (a micro-batch file) -> locator (first non-finite op) -> text
and inside a slime run: slime_plugin.policy_loss (the running release's loss inside loss/guard) and
slime_plugin.before_train_step (trace/sentinels/; reports; NANSCOPE_TRACE_STEP -> trace/tracer/step).
"""

__version__ = "0.1.0"
