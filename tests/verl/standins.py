"""verl 0.9.0's actor and critic updates on a CPU host: the stand-ins they need, each naming what it replaces.

They go through verl's own registries (only `padding` and `value_head` rebind a function), in the rank processes of
tests/verl only; nothing in the package knows them (shared/research/verl-plugin.md §4, measured there).

    platform   verl.plugin.platform.platform_manager (v0.9.0 :113-117) falls back to nvidia/cuda on a CPU host, so
               get_device_name() says "cuda" and torch.cuda.current_device() fails: a `cpu` platform registered in
               verl's PlatformRegistry, selected by VERL_PLATFORM=cpu
    engine     verl registers FSDPEngineWithLMHead and the critic's FSDPEngineWithValueHead for device cuda and npu
               only (workers/engine/fsdp/transformer_impl.py:1115, :1562): the same classes registered in verl's
               EngineRegistry for device "cpu"
    padding    verl.utils.attention_utils._get_attention_functions (:30) imports flash_attn.bert_padding on every
               non-NPU host: pointed at verl's own pure-torch helpers, verl/utils/npu_flash_attn_utils.py (einops)
    value_head verl.utils.model.load_valuehead_model (:637-675), which the critic's engine imports when it builds the
               model (fsdp/transformer_impl.py:272-285), loads AutoModelForTokenClassification with
               attn_implementation="flash_attention_2" written in (:645), which transformers refuses without
               flash_attn; verl then falls back to trl (:649-653), absent here: the same load with "eager"
"""

from __future__ import annotations

import contextlib
import types

import torch


def platform() -> None:
    """A `cpu` platform in verl's PlatformRegistry (call before anything asks verl for the device)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    none = lambda *a, **k: None  # noqa: E731
    zero = lambda *a, **k: 0  # noqa: E731
    # what verl asks of `torch.<device>`: memory figures (flops_counter.py, profiler), the name (flops_counter.py:77)
    module = types.SimpleNamespace(
        max_memory_allocated=zero, max_memory_reserved=zero, memory_allocated=zero, memory_reserved=zero,
        reset_peak_memory_stats=none, empty_cache=none, synchronize=none, get_device_name=lambda *a: "CPU",
        is_available=lambda: True, device_count=lambda: 1, current_device=lambda: "cpu",
        manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed, mem_get_info=lambda *a: (1 << 34, 1 << 34),
        get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state,
    )  # fmt: skip

    class CPUPlatform(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: module)
        nvtx_range = staticmethod(lambda msg: contextlib.nullcontext())

        def is_available(self, *a, **k):
            return True

        is_platform_available = is_available

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, *a):
            return None

        synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = set_device

        def manual_seed(self, seed):
            return torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def get_device_capability(self, index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CUDA_VISIBLE_DEVICES"

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    PlatformRegistry.register(platform="cpu")(CPUPlatform)


def engine_and_padding() -> None:
    """FSDP registered for device `cpu` (actor and critic), verl's pure-torch padding helpers for flash_attn's, and
    the critic's value-head loader with eager attention (after `platform`)."""
    from verl.utils import attention_utils
    from verl.utils import model as verl_model
    from verl.utils import npu_flash_attn_utils as pure_torch
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)
    EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithValueHead)
    verl_model.load_valuehead_model = _value_head
    helpers = (pure_torch.index_first_axis, pure_torch.pad_input, pure_torch.rearrange, pure_torch.unpad_input)
    attention_utils._get_attention_functions = lambda: helpers


def _value_head(local_path, torch_dtype, model_config, trust_remote_code):
    """verl.utils.model.load_valuehead_model's first try (:641-648), with eager attention for flash_attention_2."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
        attn_implementation="eager", trust_remote_code=trust_remote_code,
    )  # fmt: skip
