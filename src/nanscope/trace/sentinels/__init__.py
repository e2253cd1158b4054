"""The always-on sentinel: on-device finiteness flags on every training step, one host sync to read them.

Modules (the package imports none of them, so the torch-free ones load without torch):
    sentinel       the Sentinel, composed of
      slots          the on-device flags of one phase (a float32 sum per check)
      call_layers    a check installed as a layer of a module's call
      output_checks  the check of every module output (and of the gradients arriving there)
      grad_screens   parameter-gradient arrival order, per-backward-call screens, check_grads
      expert_tokens  each MoE layer's per-expert token counts, per micro-batch, kept on the device
    reading        what the sentinel read: Reading, Hit, Producer (torch-free)
    expert_counts  a reading's expert counts in public names, and the zero-token verdict (torch-free)
    classify       a reading (and what the loss saw) -> a class of cause (torch-free)
    observe        a reading in public module names, loss-input counts, causal order across ranks (torch-free at
                   import): shared by the plugin, the CPU harness and expert_counts
"""
