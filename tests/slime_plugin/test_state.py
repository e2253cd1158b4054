"""The plugin's state: one installation per process, settings read once, and no micro-batch kept without a hook."""

import gc
import tracemalloc
import weakref

import pytest
import torch

from nanscope import case, hazards, slime_plugin
from nanscope.loss import microbatch
from nanscope.loss.microbatch import Parallel
from nanscope.slime_plugin import state
from nanscope.slime_plugin.settings import Settings


@pytest.fixture(autouse=True)
def fresh_installation(monkeypatch):
    for name in ("NANSCOPE_NAN_POLICY", "NANSCOPE_ON_NONFINITE", "NANSCOPE_REPORT_DIR"):
        monkeypatch.delenv(name, raising=False)
    slime_plugin.uninstall()
    yield
    slime_plugin.uninstall()


def small_batch(seed: int):
    """A fresh 2-sample micro-batch (vocab 64) and its logits, as slime hands a custom loss one."""
    policy = hazards.synthetic_policy(64, seed)
    batch = hazards.build("healthy", policy, case.rollout(64, seed, n_samples=2), seed)
    batch.pop("hazard_site")
    logits = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    return batch, logits


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_the_loss_alone_keeps_no_micro_batch_over_1000_calls():
    # Installed without the hook, the loss used to append every micro-batch of the run to a module-level list
    # (device tensors included) and scan that list on each call. Now nothing outlives the call: after 1,000
    # calls every batch but the last is gone, and the memory held stays flat (what is left after the first
    # 100 calls is what is left after 1,000, within 256 KiB).
    args = case.args(global_batch_size=2)
    refs, held = [], []
    tracemalloc.start()
    try:
        for i in range(1000):
            batch, logits = small_batch(i % 7)
            ssm = microbatch.make_sum_of_sample_mean(batch, Parallel(), False, select=False)
            loss, _ = slime_plugin.policy_loss(args, batch, logits, ssm)
            assert torch.isfinite(loss)
            refs.append(weakref.ref(batch["unconcat_tokens"][0]))
            del batch, logits, ssm, loss
            if i in (99, 999):
                gc.collect()
                held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert held[1] - held[0] < 256 * 1024, held


def test_settings_are_read_once_per_installation(monkeypatch):
    monkeypatch.setenv("NANSCOPE_NAN_POLICY", "strict")
    first = state.installation()
    assert first.settings.nan_policy == "strict"
    monkeypatch.setenv("NANSCOPE_NAN_POLICY", "drop")
    assert state.installation() is first and first.settings.nan_policy == "strict"
    slime_plugin.uninstall()
    assert state.installation().settings.nan_policy == "drop"


def test_configure_gives_the_settings_as_an_object(monkeypatch):
    monkeypatch.setenv("NANSCOPE_ON_NONFINITE", "bogus")  # never read: the object wins
    installed = slime_plugin.configure(Settings(on_nonfinite="skip", report_dir="/r"))
    assert state.installation() is installed
    assert (installed.settings.on_nonfinite, installed.settings.report_dir) == ("skip", "/r")
