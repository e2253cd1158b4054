"""Stand-in for sglang.srt.utils: the names slime imports at module level (sglang_engine.py:13,
update_weight_utils.py:5); both serve the rollout engines, which a --debug-train-only run never starts."""


def kill_process_tree(*args, **kwargs):
    raise RuntimeError("nanscope's SGLang stand-in: there is no SGLang server to kill")


class MultiprocessingSerializer:
    """Serialises weights for SGLang's engines (update_weight_utils.py); update_weights returns first here."""

    @staticmethod
    def serialize(*args, **kwargs):
        raise RuntimeError("nanscope's SGLang stand-in: no weights are sent to SGLang under --debug-train-only")
