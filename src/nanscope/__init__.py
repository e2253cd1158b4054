"""nanscope: find, reproduce and fix NaN in Megatron-based RL runs (slime GRPO), on a laptop CPU.

Data flow, one line per command:
    repro    hazards (case.py's flags) -> megatron/launcher -> worker/step on torchrun ranks -> spec records -> repro -> report/repro
    hazards  hazards.build on a synthetic policy -> loss.get(name).loss_function -> report/hazards
    doctor   launch/script (bounded static bash) -> config -> topology, findings, candidates -> report/doctor
    scan     dumps/io (restricted loader, streamed samples) -> dumps/checks -> report/scan
    trace    trace/replay (a micro-batch file) -> trace/locator (first non-finite op) -> report/trace
and inside a slime run: slime_plugin.policy_loss (the running release's loss, guarded) and
slime_plugin.before_train_step (trace/sentinel; reports; NANSCOPE_TRACE_STEP -> trace/step).
"""

__version__ = "0.1.0"
