"""The environment that hides CUDA from the harness's processes: torch reads it as no device, and slime's lookup of
its GPU id in it (slime v0.1.0 ray/train_actor.py:12-17) still finds the slot Ray gave it."""

import os
import subprocess
import sys

import pytest

from nanscope.megatron import hidden_cuda

PROBE = (
    "import torch; "
    "print(torch.cuda._parse_visible_devices(), torch.cuda.device_count(), torch.cuda.is_available(), "
    "torch.cuda.is_initialized())"
)


@pytest.mark.parametrize("env", [dict(hidden_cuda.HARNESS), hidden_cuda.slime_run(4)], ids=["harness", "slime"])
def test_torch_sees_no_device_and_never_initialises_cuda(env):
    out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.stdout.split() == ["[]", "0", "False", "False"], out.stderr[-2000:]


def test_the_harness_hides_every_device_and_asks_nvml_not_the_driver():
    assert dict(hidden_cuda.HARNESS) == {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_slime_finds_its_ray_slot_in_the_list_that_names_no_device(gpus):
    env = hidden_cuda.slime_run(gpus)
    ids = env["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(ids) == gpus and ids[0] == "-1"  # Ray offers `gpus`; CUDA stops at the invalid first index
    for slot in range(gpus):
        # Ray maps its GPU slot to the list's entry (Worker.get_accelerator_ids_for_accelerator_resource); slime
        # looks that entry up in the list: its LOCAL_RANK is the slot, as where the variable is unset
        assert ids.index(ids[slot]) == slot
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert env["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
