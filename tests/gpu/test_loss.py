"""The GPU tier's loss scenarios (issue 40 item 4): the loss on CUDA, and the plugin's loss through each slime
release's own loss and metric packing. Each runs in its own subprocess on one device (tests/gpu/scenario.py);
the figures it records (time and peak-memory ratios) are printed for docs/costs.md, never asserted.
"""

import json

import pytest

from tests.checkouts import RELEASES, slime_release
from tests.gpu import scenario

FP32_EXP_MAX = 88.72


@pytest.mark.timeout(900)
def test_the_loss_on_cuda(tmp_path):
    r = scenario.run("loss_cuda", tmp_path / "loss_cuda.json", timeout_s=840)
    print(json.dumps({"machine": r["machine"], "timing": r["timing"], "syncs": r["syncs"]}, indent=1))
    for name, equal in r["bitwise"].items():  # a healthy batch: the guard changes no bit
        assert equal["loss"] and equal["grad"], name
    o = r["overflow"]  # the case's hazard: a masked token, ref - logp past fp32's exp overflow
    assert o["masked"] and o["ref_minus_old"] > FP32_EXP_MAX
    assert o["as_is_nan_grad_entries"] > 0 and o["safe_loss_finite"] and o["safe_grad_finite"]
    assert o["safe_equals_as_is_on_defused"]
    s = r["syncs"]
    assert s["safe_under_error_mode"] == "ran"  # set_sync_debug_mode("error"): not one synchronizing call
    assert s["safe"] == s["as_is"] == []
    for vocab in ("151936", "32768"):
        t = r["timing"][vocab]
        assert t["time_ratio"] > 0 and t["peak_ratio"] > 0 and t["tokens"] > 8000  # recorded, not judged


@pytest.mark.timeout(600)
@pytest.mark.parametrize("tag", RELEASES)
def test_the_plugins_loss_through_the_release_own_loss_and_packing(tmp_path, tag):
    checkout = slime_release(tag)  # NANSCOPE_SLIME_SRC: the device script's copy of ../shared/slime-src
    env = {"NANSCOPE_SLIME_SRC": str(checkout.parent), "TORCHDYNAMO_DISABLE": "1"}
    r = scenario.run("loss_releases", tmp_path / f"loss_releases-{tag}.json", "--release", tag, env=env, timeout_s=540)
    assert r["release"] == tag
    configs = r["configs"]
    assert ("recompute-loss-function" in configs) == (tag != "v0.1.0")
    print(json.dumps({name: {k: len(v) for k, v in c["syncs"].items()} for name, c in configs.items()}))
    for name, c in configs.items():
        syncs, keys = c["syncs"], c["keys"]
        guards = [k for k in keys["alone"] if k.startswith("nan_guard/")]
        assert keys["hooked"] == keys["own"] and keys["alone"] == keys["own"] + guards, name
        assert syncs["hooked"] == syncs["own"], (name, syncs)  # the plugin's loss adds no sync
        assert not any(where.startswith("nanscope/") for where in syncs["hooked"]), (name, syncs["hooked"])
        assert len(syncs["alone"]) == len(syncs["own"]) + len(guards), (name, syncs)  # the packing reads each
        assert c["plugin_finite"] and len(c["record"]) == 1, name
        if c["hazard"] is None:  # healthy: the release's own loss and gradient, bit for bit
            assert c["hooked_equals_own"], name
