"""Stand-in for sglang.srt.patch_torch (update_weight_utils.py:17): called only when weights go to SGLang."""


def monkey_patch_torch_reductions():
    raise RuntimeError("nanscope's SGLang stand-in: no weights are sent to SGLang under --debug-train-only")
