"""The repro bundle: what a rank's loss received on a non-finite step, written by the plugin, replayed offline.

Modules (the package imports none of them, so the torch-free ones load without torch):
    bundle         the format: what a rank writes on a non-finite step, and how it is packed
    bundle_load    a bundle read within loading.torch_file's bounds, every field checked
    bundle_replay  its loss replayed offline from the recorded log-probs, then through the guard
    bundle_rows    which rollout-dump row each of its samples is (torch-free)
    bundle_step    a step's bundles replayed together, as `nanscope trace REPORT_DIR` does
    bundle_text    a replayed bundle in words, one line per rank for a directory (torch-free)
    slime_import   a slime checkout's loss imported off the cluster (stand-ins), megatron's parallel state
"""
