"""Stand-in for torch_memory_saver (slime actor.py:11, megatron_utils/__init__.py:5): a CUDA allocator hook.

slime calls it only under --offload (which --colocate turns on): sleep, wake_up and update_weights. nanscope's CPU
run drops --colocate, so none of these runs; the methods raise if one does. `_impl` is None: megatron_utils'
deep_ep hook (__init__.py:11) reads it only when deep_ep imports, which it does not here.
"""


class _TorchMemorySaver:
    _impl = None

    def _refuse(self, *args, **kwargs):
        raise RuntimeError("nanscope's torch_memory_saver stand-in: --offload/--colocate cannot run on CPU")

    pause = resume = disable = region = _refuse


torch_memory_saver = _TorchMemorySaver()
