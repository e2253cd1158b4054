"""The harness's one torchrun launch of healthy, kl-exp-overflow, healthy, shared by the tests that read it.

test_harness.py checks it; test_ray_launcher.py compares the same runs launched as Ray actors with it, record
for record, without paying for a second torchrun launch.
"""

import os

import pytest

from nanscope import case
from nanscope.megatron import launcher
from nanscope.megatron.spec import Layout, RunSpec
from tests.processes import ProcessWatch

# run 2: healthy again, its first-step log-prob pass shared with run 0's (run.Runner.policy), its grads compared on
# each rank with those run 0 saved
HARNESS_RUNS = (
    RunSpec("healthy", save_params=True, save_grads=True),
    RunSpec("kl-exp-overflow", compare_grads=0),
    RunSpec("healthy", compare_grads=0),
)


@pytest.fixture(scope="session")
def launched_watched(tmp_path_factory):
    """The launch, and the environment each of its processes was started with (tests/processes.py)."""
    out = tmp_path_factory.mktemp("harness")
    with ProcessWatch(os.getpid()) as watch:
        launched = launcher.launch(
            list(HARNESS_RUNS), Layout(tp=2, pp=2), timeout_s=240, rank_timeout_s=120, out_dir=out,
            loss_flags=case.loss_flags(),
        )  # fmt: skip
    return launched, watch


@pytest.fixture(scope="session")
def launched(launched_watched):
    return launched_watched[0]
