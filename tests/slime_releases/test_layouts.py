"""The layout matrix through slime v0.1.0's own train() and train_one_step (layout_worker.py), the hook over
slime's own loss: DP 2 with the distributed optimizer, --overlap-grad-reduce with megatron's check on and off,
full activation recompute, PP 2 with 2 virtual stages (get_model's stand-in builds one chunk per virtual stage);
raise, skip and skip-on-transient with the rerun on and off. The assertions are the harness matrix's
(tests/megatron/layout_checks.py): bounded, megatron's words on every raising rank, the report and the bundle,
skip on every rank, the next healthy rollout bitwise equal to a run that trained it alone.

Needs slime's v0.1.0 checkout under NANSCOPE_SLIME_SRC (tests/checkouts.py).
"""

from pathlib import Path

import pytest

from tests.checkouts import slime_release
from tests.megatron.layout_checks import DP2_LAYOUTS, RAISE, SKIP, check_dp2, check_vpp, launch

WORKER = Path(__file__).with_name("layout_worker.py")

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _launch(tmp_path_factory, group: str) -> list[dict]:
    checkout = slime_release("v0.1.0")
    out = tmp_path_factory.mktemp(f"slime-{group}")
    return launch(out, WORKER, "--slime-src", str(checkout), "--group", group)


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    return _launch(tmp_path_factory, "dp2")


@pytest.fixture(scope="module")
def vpp(tmp_path_factory):
    return _launch(tmp_path_factory, "pp2-vpp2")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", DP2_LAYOUTS)
@pytest.mark.parametrize("mode", RAISE + SKIP)
def test_slime_train_one_step_at_dp2(dp2, layout, mode):
    check_dp2(dp2, layout, mode)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", RAISE + SKIP)
def test_slime_train_one_step_with_two_virtual_stages(vpp, mode):
    check_vpp(vpp, mode)
