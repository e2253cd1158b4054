"""The CPU layer's patches for slime's own train.py (`cpu.install_slime`, `cpu.install_driver`): each does what its
comment says, names the CUDA-only call it replaces, and undoes cleanly."""

import inspect

import pytest
import torch
import torch.distributed as dist

from nanscope.megatron import cpu, cpu_distributed

SLIME_PATCHED = [
    "torch.cuda.set_device",
    "torch.cuda.device_count",
    "torch.distributed.init_process_group",
    "torch.empty_like",
    "torch.cuda.Stream",
    "torch.cuda.current_stream",
    "torch.cuda.stream",
    "megatron.core.transformer.moe.token_dispatcher.maybe_move_tensor_to_cpu",
    "torch.cuda.get_rng_state",
    "torch.cuda.mem_get_info",
    "torch.cuda.memory_allocated",
    "torch.cuda.memory_reserved",
    "megatron.core.optimizer.Adam",
]


@pytest.fixture
def slime():
    names = cpu.install_slime(gpus_per_node=4)
    try:
        yield names
    finally:
        cpu.uninstall()


def test_install_slime_adds_its_patches_after_installs_and_is_idempotent(slime):
    base = len(slime) - len(SLIME_PATCHED)
    assert slime[base:] == SLIME_PATCHED and base == 12  # install()'s twelve first (recompute's RNG among them)
    assert cpu.install_slime(gpus_per_node=4) == slime and cpu.install() == slime


def test_uninstall_restores_what_install_slime_patched():
    from megatron.core import optimizer

    before = (dist.init_process_group, torch.empty_like, torch.cuda.device_count, torch.cuda.Stream, optimizer.Adam)
    cpu.install_slime(gpus_per_node=4)
    cpu.uninstall()
    assert (dist.init_process_group, torch.empty_like, torch.cuda.device_count, torch.cuda.Stream,
            optimizer.Adam) == before  # fmt: skip
    assert cpu.installed() == []


def test_nccl_becomes_gloo_and_the_node_has_its_logical_gpus(slime):
    seen = []
    wrapped = cpu_distributed.gloo(lambda *args, **kwargs: seen.append((args, kwargs)))
    wrapped(backend="nccl", timeout=5)
    wrapped("nccl", "env://")
    assert seen == [((), {"backend": "gloo", "timeout": 5}), (("gloo", "env://"), {})]
    assert torch.cuda.device_count() == 4 and 5 % torch.cuda.device_count() == 1  # slime's rank % device_count()
    torch.cuda.set_device("cuda:3")  # nothing to select


def test_pinned_copies_and_streams_on_cpu(slime):
    param = torch.randn(3, dtype=torch.bfloat16)
    copy = torch.empty_like(param, device=torch.device("cpu"), pin_memory=True)  # actor.py:122
    assert copy.shape == param.shape and copy.dtype == param.dtype and not copy.is_pinned()
    side = torch.cuda.Stream()
    assert torch.cuda.current_stream() is torch.cuda.current_stream() and torch.cuda.current_stream() != side
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        event = side.record_event()
    event.synchronize()


def test_split_sizes_reach_all_to_all_as_numpy(slime):
    from megatron.core.transformer.moe import token_dispatcher

    sizes = torch.tensor([69, 58])
    host = token_dispatcher.maybe_move_tensor_to_cpu(sizes, as_numpy=True, record_stream=True)
    assert host.tolist() == [69, 58] and type(host).__module__ == "numpy"
    assert (
        token_dispatcher.maybe_move_tensor_to_cpu(sizes) is sizes
        and token_dispatcher.maybe_move_tensor_to_cpu(None) is None
    )


def test_adam_after_megatrons_eager_state_init_is_torchs_first_step(slime):
    from megatron.core import optimizer

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = optimizer.Adam(params, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.98), eps=1e-8)
    for p in params:  # megatron's init_state_fn (optimizer/__init__.py:376-383), which slime calls eagerly
        ours.state[p]["exp_avg"], ours.state[p]["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
    ref = torch.optim.AdamW(twins, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.98), eps=1e-8)
    for _ in range(2):
        for p, t in zip(params, twins):
            p.grad = t.grad = torch.full_like(p, 0.5)
        ours.step()
        ref.step()
    for p, t in zip(params, twins):
        assert torch.equal(p, t)
    assert all(float(ours.state[p]["step"]) == 2.0 for p in params)


def test_memory_reports_read_the_hosts(slime):
    free, total = torch.cuda.mem_get_info(torch.device("cpu"))  # slime's memory_utils.available_memory
    assert 0 < free <= total
    assert torch.cuda.memory_allocated("cpu") == torch.cuda.memory_reserved("cpu") == 0


def test_the_recompute_rng_state_is_the_cpu_generators_alone(slime):
    from megatron.core.tensor_parallel import random as mp_random

    state = mp_random._get_cuda_rng_state()
    assert state.numel() == 0 and state.dtype == torch.uint8
    mp_random._set_cuda_rng_state(state)  # nothing to restore
    assert torch.cuda.get_rng_state().numel() == 0  # Megatron-LM's save_checkpoint reads it


def test_the_driver_sees_the_cases_h100():
    names = cpu.install_driver()
    try:
        assert names == ["torch.cuda.get_device_properties"]
        assert torch.cuda.get_device_properties(torch.device("cuda:0")).major == 9
    finally:
        cpu.uninstall()
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.get_device_properties(torch.device("cuda:0"))  # the CPU build's own: no CUDA


def test_every_slime_patch_has_a_comment_naming_the_call_it_replaces():
    for fn in (cpu.install_slime, cpu.install_driver):
        lines = [line.strip() for line in inspect.getsource(fn).splitlines()]
        tuples = [i for i, line in enumerate(lines) if line.startswith("(") and line.endswith("),")]
        assert tuples
        for i in tuples:
            comment = []  # the comment lines right above the patch
            for line in reversed(lines[:i]):
                if not line.startswith("#"):
                    break
                comment.insert(0, line)
            assert comment and ".py:" in " ".join(comment), f"no comment naming file:line above {lines[i]}"
