"""Issue 41, round 24: the frame classes of holdout24 (reports doctor had never read), on crafted input of each class:
anomaly mode's forward call ending before the op's own call (11); a frame named for one model's step (10). Each
positive test fails on main 6020a98."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. autograd's anomaly mode: `Error detected in <node>. Traceback of forward call that caused the error:` then the
# stack stored at the forward op, outermost first (pytorch/pytorch 042876c torch/csrc/autograd/python_anomaly_mode.cpp
# :16-25, :113-116); `model(x)` passes through torch's module dispatch, Module.__call__ = _wrapped_call_impl ->
# _call_impl -> forward (torch 2.13.0 torch/nn/modules/module.py:1774-1789, :1917), whose frames CPython prints as
# `  File "...", line N, in f` and the code line (Lib/traceback.py); here the paste cuts it mid-frame
_HEAD = (
    "/usr/lib/python3.12/site-packages/torch/autograd/graph.py:824: UserWarning: Error detected in "
    "ScaledDotProductEfficientAttentionBackward0. Traceback of forward call that caused the error:\n"
    '  File "/home/me/recipes/train.py", line 210, in train\n'
    "    logits = self.model(tokens)\n"
    '  File "/usr/lib/python3.12/site-packages/torch/nn/modules/module.py", line 1774, in _wrapped_call_impl\n'
    "    return self._call_impl(*args, **kwargs)\n"
)
_ORDER = (
    "it prints that stack outermost first (pytorch/pytorch 042876c torch/csrc/autograd/python_anomaly_mode.cpp:16-25, "
    ":113-116; torch/fx/traceback.py)."
)
_DISPATCH = (
    "the paste ends before the op's own call: its last whole frame is "
    "/usr/lib/python3.12/site-packages/torch/nn/modules/module.py:1774 _wrapped_call_impl, "
    "`return self._call_impl(*args, **kwargs)`, torch's module dispatch, which calls a module's forward, never an op "
    "(torch 2.13.0 torch/nn/modules/module.py:1774-1789, :1917)"
)
_THROUGH = (
    "; the last frame outside torch, /home/me/recipes/train.py:210 train, `logits = self.model(tokens)`, is the call it "
    "came through; "
)


def test_1_a_forward_call_cut_mid_frame_after_the_module_dispatch(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _HEAD + '  File "/usr/lib/python3.12/site-p\n')
    assert (
        "Anomaly mode traced the forward call of ScaledDotProductEfficientAttentionBackward0 (line 1): "
        + _DISPATCH
        + ", and the frames after it are cut mid-frame"
        + _THROUGH
        + _ORDER
    ) in out
    assert "is where the forward op was called" not in out
    assert doc["anomaly_forward"]["short_of_op"] == {
        "why": ["cut", "dispatch"],
        "came_through": {"path": "/home/me/recipes/train.py", "line": 210, "function": "train",
                         "code": "logits = self.model(tokens)"},
    }  # fmt: skip


def test_1_a_forward_call_ending_at_the_module_dispatch(tmp_path, capsys):
    log = _HEAD + " (Triggered internally at /pytorch/torch/csrc/autograd/python_anomaly_mode.cpp:122.)\n"
    doc, out = _doctor(tmp_path, capsys, log)
    assert ("(line 1): " + _DISPATCH + _THROUGH + _ORDER) in out
    assert doc["anomaly_forward"]["short_of_op"]["why"] == ["dispatch"]


def test_1_a_user_frame_cut_after_it_names_itself_as_the_way_through(tmp_path, capsys):
    log = (
        "UserWarning: Error detected in MulBackward0. Traceback of forward call that caused the error:\n"
        '  File "/home/me/model.py", line 30, in forward\n    h = self.norm(x) * gate\n  File "/usr/lib/pyth\n'
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert (
        "the paste ends before the op's own call: its last whole frame is /home/me/model.py:30 forward, "
        "`h = self.norm(x) * gate`, and the frames after it are cut mid-frame; the last frame outside torch, "
        "/home/me/model.py:30 forward, `h = self.norm(x) * gate`, is the call it came through; "
    ) in out


# the op's own call last (torch.nn.functional's linear in nn.Linear.forward): the existing wording stays
def test_1_a_forward_call_ending_at_the_ops_call_keeps_its_wording(tmp_path, capsys):
    log = (
        "UserWarning: Error detected in AddmmBackward0. Traceback of forward call that caused the error:\n"
        '  File "/home/me/model.py", line 30, in forward\n    h = self.proj(x)\n'
        '  File "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py", line 125, in forward\n'
        "    return F.linear(input, self.weight, self.bias)\n"
        " (Triggered internally at /pytorch/torch/csrc/autograd/python_anomaly_mode.cpp:122.)\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert "`return F.linear(input, self.weight, self.bias)`, is where the forward op was called; " in out
    assert doc["anomaly_forward"]["short_of_op"] is None and "the paste ends before" not in out


# 2. a NaN error's traceback through a function named for one model's step: gigagan-pytorch's
# GigaGAN.train_discriminator_step (lucidrains/gigagan-pytorch gigagan_pytorch.py), autograd's anomaly error under it
# (torch/csrc/autograd/engine.cpp: `Function '...' returned nan values in its Nth output.`)
def _gan(step: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/home/me/train.py", line 49, in <module>\n    gan(steps = 100)\n'
        '  File "/home/me/gan.py", line 2559, in forward\n    out = self.' + step + "(dl_iter)\n"
        '  File "/home/me/gan.py", line 2320, in ' + step + "\n    self.accelerator.backward(total_loss)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/_tensor.py", line 487, in backward\n    torch.autograd.backward(\n'
        "RuntimeError: Function 'AddmmBackward0' returned nan values in its 2th output.\n"
    )


def test_2_a_frame_of_the_discriminators_step_names_the_model(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _gan("train_discriminator_step"))
    assert doc["summary"]["model"] == "discriminator"
    assert (
        "The model: discriminator (its traceback passes through train_discriminator_step (/home/me/gan.py:2320), the "
        "discriminator's step)."
    ) in out


@pytest.mark.parametrize("step", ["train_critic", "actor_step"])
def test_2_actor_critic_steps_name_their_model(tmp_path, capsys, step):
    doc, _ = _doctor(tmp_path, capsys, _gan(step))
    assert doc["summary"]["model"] == step.replace("train_", "").replace("_step", "")


@pytest.mark.parametrize("step", ["train_step", "training_step", "generate"])
def test_2_a_step_of_no_model_names_none(tmp_path, capsys, step):
    doc, out = _doctor(tmp_path, capsys, _gan(step))
    assert doc["summary"]["model"] is None and "The model:" not in out
