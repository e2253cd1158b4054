"""nanscope.loss.target: which slime the guard wraps, by signature, and the refusal of any other.

The loss modules here are stand-ins with the signatures of each release's functions (bodies are never
called); tests/slime_releases runs the real releases.
"""

import sys
import types

import pytest
import torch

from nanscope.facts import releases
from nanscope.loss import target as targets
from nanscope.slime_plugin.settings import Settings
from nanscope.slime_plugin.state import Installation

V0_1_0_LOSS = """
import torch
def policy_loss_function(args, batch, logits, sum_of_sample_mean): ...
def loss_function(args, batch, num_microbatches, logits): ...
def compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=None): ...
def compute_approx_kl(log_probs, log_probs_base, kl_loss_type): ...
"""
V0_1_0_CP = "def slice_log_prob_with_cp(log_prob, total_length, response_length): ..."
V0_3_1_LOSS = """
import torch
def policy_loss_function(args, batch, logits, sum_of_sample_mean): ...
def loss_function(args, batch, num_microbatches, step_global_batch_size, logits): ...
def compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=None): ...
def compute_cispo_loss(ppo_kl, log_probs, advantages, eps_clip, eps_clip_high): ...
def compute_approx_kl(log_probs, log_probs_base, kl_loss_type, importance_ratio=None): ...
def vanilla_tis_function(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs): ...
def icepop_function(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs): ...
"""
V0_3_1_CP = V0_1_0_CP
MAIN_LOSS = V0_3_1_LOSS + "def enable_log_prob_capture(): ...\n"


@pytest.fixture
def installed(monkeypatch):
    """Install stand-in slime loss and cp_utils modules from source; returns the loss module."""

    def install(loss_source: str, cp_source: str) -> types.ModuleType:
        modules = {}
        for name, source in ((releases.SLIME_LOSS, loss_source), (releases.SLIME_CP, cp_source)):
            modules[name] = types.ModuleType(name)
            exec(source, modules[name].__dict__)
            monkeypatch.setitem(sys.modules, name, modules[name])
        return modules[releases.SLIME_LOSS]

    return install


@pytest.mark.parametrize(
    "loss, cp, name",
    [
        (V0_1_0_LOSS, V0_1_0_CP, "v0.1.0"),
        (V0_3_1_LOSS, V0_3_1_CP, "v0.3.1"),
        (MAIN_LOSS, V0_3_1_CP, "main (2026-08-21, 624b824)"),
    ],
)
def test_each_release_is_identified_by_its_signatures(installed, loss, cp, name):
    module = installed(loss, cp)
    target = targets.running()
    assert target.release.name == name and target.module is module
    assert target.slicer is sys.modules[releases.SLIME_CP].slice_log_prob_with_cp
    state = Installation(Settings())
    assert state.target() is state.target()  # checked once per installation


def test_a_missing_name_is_refused_in_one_line_naming_it_and_the_release(installed):
    installed(V0_3_1_LOSS.replace("def compute_cispo_loss", "def renamed_cispo_loss"), V0_3_1_CP)
    with pytest.raises(targets.UnsupportedRelease) as e:
        targets.running()
    assert str(e.value) == (
        "nanscope.slime_plugin: slime (no installed metadata) is not a release the plugin knows: closest is "
        "v0.3.1, but slime.backends.megatron_utils.loss.compute_cispo_loss is missing; "
        "supported: v0.1.0, v0.2.4, v0.3.1, main (2026-08-21, 624b824)"
    )


def test_a_changed_signature_is_refused(installed):
    installed(V0_1_0_LOSS.replace("log_probs_base, kl_loss_type", "log_probs_base, kl_type"), V0_1_0_CP)
    with pytest.raises(
        targets.UnsupportedRelease,
        match=(
            r"closest is v0\.1\.0, but slime\.backends\.megatron_utils\.loss\.compute_approx_kl"
            r"\(log_probs, log_probs_base, kl_type\) is not \(log_probs, log_probs_base, kl_loss_type\);"
        ),
    ):
        targets.running()


def test_a_loss_module_without_torch_is_refused(installed):
    installed(V0_1_0_LOSS.replace("import torch", "torch = None"), V0_1_0_CP)
    with pytest.raises(targets.UnsupportedRelease, match=r"megatron_utils\.loss\.torch is not the torch module"):
        targets.running()


def test_the_plugin_refuses_instead_of_falling_back(installed):
    from nanscope import slime_plugin

    installed(V0_1_0_LOSS, "")  # slice_log_prob_with_cp missing
    with pytest.raises(targets.UnsupportedRelease, match="slice_log_prob_with_cp is missing"):
        slime_plugin.policy_loss({}, {}, torch.zeros(1, 1, 1), None)


def test_without_slime_the_target_is_nanscopes_model():
    assert "slime" not in sys.modules and releases.SLIME_LOSS not in sys.modules
    target = targets.running()
    assert target.release is targets.MODEL and target.slicer is None
    assert target.module is sys.modules["nanscope.loss.as_is"]
    assert target.release.name == "nanscope's model of slime v0.1.0 (nanscope.loss.as_is; slime is not installed)"


def test_reads_follow_the_release_and_flags():
    args = types.SimpleNamespace(use_tis=False, use_kl_loss=True)
    assert releases.BY_KEY["v0.1.0"].loss_api.reads(args) == ("log_probs", "advantages", "ref_log_probs")
    # since v0.2 the loss reports train_rollout_logprob_abs_diff whenever rollout log-probs are there
    assert releases.BY_KEY["v0.3.1"].loss_api.reads(args) == (
        "log_probs",
        "advantages",
        "rollout_log_probs",
        "ref_log_probs",
    )
