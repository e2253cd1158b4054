"""Stand-in for sglang.srt.model_executor.model_runner (slime v0.3.1 backends/megatron_utils/sglang.py:22, v0.1.0
update_weight_utils.py:20): `FlattenedTensorBucket` packs weights sent to SGLang's engines, which a
--debug-train-only run never does."""


class FlattenedTensorBucket:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("nanscope's SGLang stand-in: no weights are sent to SGLang under --debug-train-only")
