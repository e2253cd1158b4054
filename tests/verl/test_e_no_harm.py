"""Issue 43, case E: nothing planted. Two steps with the plugin (loss_mode nanscope over vanilla) are bitwise
verl's alone: parameters after each step and every metric verl logs (less the time-based ones). The plugin adds
exactly one collective a step (the vote's all-gather) and at most one host read a step (the vote's), counted over
torch.distributed's collectives and Tensor.item/tolist/__bool__/... during update_actor (tests/verl/rank.py)."""

import pytest

from tests.verl import harness, plugin
from tests.verl.harness import Spec
from tests.verl.rank import COLLECTIVES, HOST_READS

pytestmark = pytest.mark.timeout(600)
TIMED = ("perf/", "timing")  # wall-clock figures: mfu, throughput


def _logged(driver: dict) -> dict:
    return {k: v for k, v in driver.items() if not k.startswith("actor/nanscope/") and not any(t in k for t in TIMED)}


def test_e_with_nothing_planted_two_steps_are_verls_bit_for_bit_with_one_collective_more(tmp_path, model):
    got = harness.run(plugin.spec(steps=2, count=True, env=plugin.with_reports(tmp_path)), tmp_path, model, name="p")
    alone = harness.run(Spec(steps=2, count=True), tmp_path, model, name="alone")
    for mine, verls in zip(got, alone):
        assert mine.error is None and plugin.ours(mine) and verls.error is None
        for step in range(2):
            assert harness.same(mine.steps[step], verls.steps[step])
            assert _logged(mine.driver[step]) == _logged(verls.driver[step])
            assert any(k.startswith("actor/nanscope/") for k in mine.driver[step])
            collectives = {n: mine.counts[step].get(n, 0) - verls.counts[step].get(n, 0) for n in COLLECTIVES}
            assert sum(collectives.values()) == 1, collectives
            reads = {n: mine.counts[step].get(n, 0) - verls.counts[step].get(n, 0) for n in HOST_READS}
            assert sum(reads.values()) <= 1, reads
