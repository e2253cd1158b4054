"""Issue 41, round 15: the classes holdout15 (24 reports doctor had never read, graded on main 84d9063) read partly,
each on crafted input of its class: sampling from the reference model (1) and TensorFlow's NanTensorHook (2). Each
test fails on round 14's doctor (main 84d9063). (holdout15 04's `[deepscale]` prefix names no framework alone:
DeepSpeed 0.3's ZeRO and ColossalAI 0.0.x's copy print it, tests/cli/test_doctor_classes.py.)"""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. a PPO script sampling from its reference model hits torch.multinomial's assert (yongzhuo/chatglm-maths#4)
def test_1_sampling_from_the_reference_model_names_it(tmp_path, capsys):
    log = ('Traceback (most recent call last):\n  File "toy_trl_train_ppo.py", line 178, in <module>\n    '
           "response_tensor = respond_to_batch_new(model_ref, query_tensor,\n  File \"toy_trl_train_ppo.py\", line 60, "
           "in respond_to_batch_new\n    next_token = torch.multinomial(probs, num_samples=1).squeeze(1)\nRuntimeError: "
           "probability tensor contains either `inf`, `nan` or element < 0\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["model"] == "reference"
    assert "The model: the reference model (a frame's code samples from model_ref (<module>, line 178))." in out


# 2. TensorFlow's NanTensorHook logs, then raises (NVIDIA/DeepLearningExamples#529)
def test_2_tensorflow_s_nan_tensor_hook_is_the_error_that_ended_the_run(tmp_path, capsys):
    log = ("ERROR:tensorflow:Model diverged with loss = NaN.\nE0526 15:34:12.011717 140569525946176 "
           "basic_session_run_hooks.py:760] Model diverged with loss = NaN.\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["failure"]["check"], doc["failure"]["op"]) == ("nonfinite-error", "NanTensorHook")
    assert "The run ended on an error naming NaN or Inf (line 1, and 1 more such line(s); NanTensorHook;" in out
