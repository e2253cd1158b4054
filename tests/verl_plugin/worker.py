"""verl 0.9.0's own actor worker on 2 gloo ranks on CPU: the stand-ins it needs, a tiny model, a mini-batch, a run.

`run(rank, spec)` (a torch.multiprocessing.spawn target) builds `ActorRolloutRefWorker(role="actor")` from verl's
ppo_trainer.yaml (Hydra), calls `init_model()` and `update_actor()` spec["steps"] times, and writes what it saw:
the engine's class, the metrics, the error each rank raised, the wall and CPU seconds of each update, and rank 0's
parameters (full tensors). Used by tests/verl_plugin/test_engine.py (slow) and benchmarks/verl_step.py.

CPU stand-ins, each naming what it replaces (verl 0.9.0 on a CPU host; shared/research/verl-plugin.md §4):
    PlatformCPU         verl's platform falls back to nvidia/cuda on a CPU host (platform_manager.py:113-117)
    FSDP for "cpu"      verl registers its FSDP engine for cuda and npu only (fsdp/transformer_impl.py:1115)
    padding helpers     flash_attn's bert_padding (attention_utils.py:30) -> verl's pure-torch npu_flash_attn_utils
A test-only fault: `fault` makes rank 1's model.layers.1.mlp output NaN ("every" pass, or the "first" only).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import types

import torch


def standins() -> None:
    """The three CPU stand-ins (the module docstring)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    zero = lambda *a, **k: 0  # noqa: E731
    device = types.SimpleNamespace(
        max_memory_allocated=zero, max_memory_reserved=zero, memory_allocated=zero, memory_reserved=zero,
        get_device_name=lambda *a, **k: "CPU", empty_cache=lambda: None, synchronize=lambda *a: None,
        is_available=lambda: True, device_count=lambda: 1, current_device=lambda: "cpu",
        manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed, reset_peak_memory_stats=lambda *a: None,
        mem_get_info=lambda *a: (1 << 34, 1 << 34), get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
    )  # fmt: skip

    class PlatformCPU(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: device)
        is_available = is_platform_available = lambda self, *a, **k: True  # noqa: E731
        current_device = lambda self: "cpu"  # noqa: E731
        device_count = lambda self: 1  # noqa: E731
        set_device = synchronize = set_allocator_settings = empty_cache = lambda self, *a: None  # noqa: E731
        manual_seed = manual_seed_all = lambda self, s: torch.manual_seed(s)  # noqa: E731
        get_device_capability = lambda self, i=0: (None, None)  # noqa: E731
        communication_backend_name = lambda self: "gloo"  # noqa: E731
        visible_devices_envvar = lambda self: "CUDA_VISIBLE_DEVICES"  # noqa: E731
        nvtx_range = staticmethod(lambda msg: contextlib.nullcontext())
        profiler_start = profiler_stop = lambda self: None  # noqa: E731
        ray_resource_name = lambda self: "CPU"  # noqa: E731
        ray_noset_envvars = lambda self: []  # noqa: E731
        is_ipc_supported = lambda self: False  # noqa: E731
        cudart = lambda self: None  # noqa: E731

    PlatformRegistry.register(platform="cpu")(PlatformCPU)


def standin_engines() -> None:
    from verl.utils import attention_utils
    from verl.utils import npu_flash_attn_utils as torch_padding
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)
    attention_utils._get_attention_functions = lambda: (
        torch_padding.index_first_axis, torch_padding.pad_input, torch_padding.rearrange, torch_padding.unpad_input
    )  # fmt: skip


def tiny_model(path: str) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(path)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 64}, f)


def config(model: str, plugin: bool, loss_mode: str, extra: tuple[str, ...] = ()):
    import verl
    from hydra import compose, initialize_config_dir

    prefix = "actor_rollout_ref."
    overrides = [
        f"model.path={model}", "actor.strategy=fsdp2", "actor.ppo_mini_batch_size=4",
        "actor.ppo_micro_batch_size_per_gpu=1", "actor.use_torch_compile=False", "model.use_remove_padding=False",
        "+model.override_config.attn_implementation=eager", "actor.fsdp_config.model_dtype=fp32",
        "actor.fsdp_config.dtype=float32", f"actor.policy_loss.loss_mode={loss_mode}", "rollout.n=1",
        "actor.optim.lr=1e-2", "model.enable_gradient_checkpointing=False",
        "rollout.log_prob_micro_batch_size_per_gpu=1", "ref.log_prob_micro_batch_size_per_gpu=1",
    ] + (["model.external_lib=nanscope.verl_plugin"] if plugin else []) + list(extra)  # fmt: skip
    overrides = [o.replace("+", "+" + prefix) if o.startswith("+") else prefix + o for o in overrides]
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):  # fmt: skip
        return compose(config_name="ppo_trainer", overrides=overrides)


def batch(rank: int, step: int, plant: str = "none"):
    """4 samples per rank: 4 prompt and 6 response tokens, one padded tail, one masked tool token; `plant` on rank 1:
    "A" a NaN old_log_probs at a trained token, "A-masked" that token masked instead, "B" a masked log-ratio ~95."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(100 + 10 * step + rank)
    b, p, r = 4, 4, 6
    ids = torch.randint(0, 128, (b, p + r), generator=g)
    attention = torch.ones(b, p + r, dtype=torch.int64)
    attention[1, -2:] = 0
    mask = attention[:, p:].clone()
    mask[2, 3] = 0
    old = -torch.rand(b, r, generator=g) * 4 - 1
    if rank == 1 and plant == "A":
        old[0, 2] = float("nan")
    if rank == 1 and plant == "A-masked":
        mask[0, 2] = 0
    if rank == 1 and plant == "B":
        old[2, 3] = -100.0
    td = TensorDict(
        {
            "input_ids": ids, "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, p:], "prompts": ids[:, :p], "response_mask": mask,
            "old_log_probs": old,
            "advantages": torch.randn(b, 1, generator=g).expand(b, r).clone(),
        },
        batch_size=[b],
    )  # fmt: skip
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(
        td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False, global_batch_size=8,
        mini_batch_size=8, epochs=1, seed=42, dataloader_kwargs={"shuffle": False}, compute_loss=True,
        temperature=1.0, multi_turn=False,
    )  # fmt: skip
    return td


def _fault(model, when: str) -> None:
    """Rank 1's model.layers.1.mlp outputs NaN on every forward ("every") or on the first only ("first")."""
    modules = dict(model.named_modules())
    name = next(n for n in modules if n.endswith("layers.1.mlp"))
    calls = [0]

    def hook(module, args, out):
        calls[0] += 1
        if when == "every" or calls[0] == 1:
            return out * float("nan")

    modules[name].register_forward_hook(hook)


COUNTED = ("all_gather", "all_reduce", "all_gather_object", "broadcast", "reduce_scatter", "all_to_all")


def _counting(counts: dict) -> None:
    """torch.distributed's collectives counted by name while `counts["on"]` (looked up at each call by verl and
    nanscope alike: `torch.distributed.all_reduce(...)`, `dist.all_gather(...)`)."""
    for name in COUNTED:
        real = getattr(torch.distributed, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            if counts["on"]:
                counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kwargs)

        setattr(torch.distributed, name, counted)


def run(rank: int, spec: dict) -> None:
    """One rank of a run (the module docstring). spec: out, model, port, plugin, loss_mode, steps, plants (per step),
    fault (None, "every", "first"), env (NANSCOPE_* for the workers)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(spec["port"]), VERL_PLATFORM="cpu", OMP_NUM_THREADS="1", **spec.get("env", {}))  # fmt: skip
    if spec.get("external_modules"):  # the fallback install path: both imported inside `import verl`
        os.environ["VERL_USE_EXTERNAL_MODULES"] = "tests.verl_plugin.standins_module,nanscope.verl_plugin"
        import verl  # noqa: F401  (imports the two modules)
    else:
        standins()
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    if not spec.get("external_modules"):
        standin_engines()
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker

    cfg = config(spec["model"], spec["plugin"], spec["loss_mode"], tuple(spec.get("overrides", ())))
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    engine = worker.actor.engine
    if spec.get("fault") and rank == 1:
        _fault(engine.module, spec["fault"])
    out = {"engine": type(engine).__name__, "metrics": [], "error": None, "seconds": [], "cpu": [], "collectives": []}
    counts = {"on": False}
    _counting(counts)
    plants = spec.get("plants", [])
    try:
        for step in range(spec["steps"]):
            data = batch(rank, step + spec.get("step_offset", 0), plants[step] if step < len(plants) else "none")
            torch.distributed.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            counts.clear()
            counts["on"] = True
            result = worker.update_actor(data)
            counts["on"] = False
            out["cpu"].append(time.process_time() - start_cpu)
            out["collectives"].append({k: v for k, v in counts.items() if k != "on"})
            torch.distributed.barrier()
            out["seconds"].append(time.perf_counter() - start)
            if result is not None:
                out["metrics"].append({k: v for k, v in tu.get(result, "metrics").items()})
    except Exception as e:  # the run's own end: recorded, as the trainer would see it
        out["error"] = f"{type(e).__name__}: {e}"
    with open(f"{spec['out']}.rank{rank}.json", "w") as f:
        json.dump(out, f, default=float)
    params = {n: p.full_tensor().detach().clone() for n, p in engine.module.named_parameters()}  # a collective
    if rank == 0:
        torch.save(params, spec["out"] + ".params.pt")
