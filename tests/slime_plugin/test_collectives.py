"""The plugin's collectives use the device the group's backend takes: NCCL (slime's default group) takes no
CPU tensor. A group whose backend is registered for CUDA only stands in for NCCL here (no GPU): torch itself
refuses a CPU tensor on it, with NCCL's words."""

import subprocess
import sys
import textwrap

import torch

WORKER = textwrap.dedent(
    """
    import os, sys
    import torch, torch.distributed as dist
    from torch.futures import Future

    class CudaOnly(dist.ProcessGroup):  # never reached with a CPU tensor: torch refuses it first
        def allreduce(self, tensors, opts=None):
            raise AssertionError(f"reached with a {tensors[0].device.type} tensor")

        def allgather(self, output_tensors, input_tensors, opts=None):
            raise AssertionError(f"reached with a {input_tensors[0].device.type} tensor")

        def getBackendName(self):
            return "cudaonly"

    dist.Backend.register_backend("cudaonly", lambda store, rank, size, timeout: CudaOnly(rank, size), devices=["cuda"])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group(sys.argv[1], rank=0, world_size=1)

    from nanscope.slime_plugin import collectives, headroom, step_vote
    from nanscope.slime_plugin.coords import Coords

    try:  # what asking this machine for a CUDA tensor gives
        torch.zeros(1, device="cuda")
        print("probe ok")
    except Exception as e:  # noqa: BLE001
        print("probe", type(e).__name__, str(e).splitlines()[0])
    print("device", collectives.device())
    for name, collective in (
        ("vote", lambda: step_vote.exchange(True, Coords(), torch.zeros(len(headroom.FIELDS))).bad_ranks),
        ("agreement", lambda: collectives.all_reduce_max([1.0])),
    ):
        try:
            print(name, collective())
        except Exception as e:  # noqa: BLE001
            print(name, "error", type(e).__name__, str(e).splitlines()[0])
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown at interpreter exit can abort ("terminate called") under load: the lines are out
    """
)


def run(backend: str, port: int) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, backend, str(port)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def test_under_gloo_the_collectives_are_cpu_tensors_and_run():
    assert run("gloo", 29611)[1:] == ["device cpu", "vote (0,)", "agreement [1.0]"]


def test_under_a_cuda_only_backend_the_collectives_ask_for_a_cuda_tensor_not_a_cpu_one():
    # They ask for a tensor on the current CUDA device, where a CPU tensor would have met the backend's refusal (what
    # NCCL says: the skip vote of 6e248a2 all-reduced torch.tensor([1.0]) on the CPU). Without a GPU, asking is what
    # fails: a CPU build's assertion, a CUDA build's runtime error (the probe's); with one, the backend is reached
    # with a CUDA tensor.
    probe, device, *outcomes = run("cudaonly", 29612)
    assert device == "device cuda"
    if torch.version.cuda is None:
        assert probe == "probe AssertionError Torch not compiled with CUDA enabled"
    failed = "AssertionError reached with a cuda tensor" if probe == "probe ok" else probe.removeprefix("probe ")
    for name, outcome in zip(("vote", "agreement"), outcomes):
        assert outcome == f"{name} error {failed}", outcome
