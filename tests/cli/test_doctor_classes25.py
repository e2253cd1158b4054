"""Issue 41, round 25: the false readings of holdout25 (24 reports of other stacks doctor had never read, graded on
0afe49d), on crafted input of each class; each positive test fails on 0afe49d."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. MMEngine's fields two spaces apart (`grad_norm: nan  loss: nan`, AILab-CVC/YOLO-World#614, holdout25 20): the
# value before a key is no word of its name
def test_1_the_value_before_a_key_is_no_word_of_its_name(tmp_path, capsys):
    log = "grad_norm: 638.4964  loss: 626.2026  loss_cls: 143.0205\ngrad_norm: nan  loss: nan  loss_cls: nan\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    assert [key for key, _ in doc["metrics"]["first_nonfinite"]["values"]] == ["grad_norm", "loss", "loss_cls"]


# 2. an exception named with its module's dotted path (TF-Agents' check_numerics, tensorflow/agents#622, holdout25
# 13): its message names NaN, not "an error that names no NaN or Inf"
def test_2_a_dotted_exception_name_is_read_as_the_error(tmp_path, capsys):
    log = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n    agent.train(experience)\n'
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: Critic loss is inf or nan. : Tensor had NaN "
        "values [Op:CheckNumerics]\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert "The run ended on an error naming NaN or Inf" in out
    assert "names no NaN or Inf" not in out


# 3. anomaly mode's forward call, then a blank line and another paste's traceback (HaiyuWu/Vec2Face#9, holdout25 02):
# the forward call ends at the blank line, its last frame the op's call, not the other paste's backward frame
def test_3_the_forward_call_ends_at_a_blank_line(tmp_path, capsys):
    log = (
        "/venv/lib/python3.8/site-packages/torch/autograd/__init__.py:276: UserWarning: Error detected in "
        "PowBackward0. Traceback of forward call that caused the error:\n"
        '  File "train.py", line 9, in <module>\n    loss = lpips(a, b)\n'
        '  File "/src/lpips.py", line 39, in forward\n    diffs[kk] = (feats0[kk] - feats1[kk]) ** 2\n'
        "\n"
        '  File "/venv/lib/python3.10/site-packages/torch/autograd/__init__.py", line 251, in backward\n'
        "    Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["anomaly_forward"]["path"] == "/src/lpips.py"
    assert doc["anomaly_forward"]["line"] == 39


# 4. a row of terms printed in fixed columns, no name on the line (isl-org/PhotorealismEnhancement#66, holdout25 07):
# its NaN values are evidence, not "no non-finite value"
def test_4_a_row_of_unnamed_values_holding_nan_is_evidence(tmp_path, capsys):
    log = (
        "2024-05-27 12:22:40,036 3 1.00 2.79 0.00 6.03 1001.44 ---- ---- ----\n"
        "2024-05-27 12:23:01,982 4 ---- ---- ---- ---- ---- nan nan nan\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["check"] == "unnamed-values"
    assert "A logged row of values no name labels holds NaN or Inf (line 2; 3 of its values NaN)" in out
    assert "no non-finite value" not in out


def test_4_a_row_of_named_values_stays_a_metric_line(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "epoch 3 loss nan acc nan lr 0.1\n")
    assert doc["summary"]["check"] != "unnamed-values"
    assert doc["metrics"]["first_nonfinite"]["metric"] == "loss"


# 5. icefall's GradScaler warnings (`Grad scale is small: 1.29e-26`, then `RuntimeError: grad_scale is too small,
# exiting: ...`: k2-fsa/icefall#1463, holdout25 17): the scaler's scale collapsed, read, not refused
def test_5_icefall_s_grad_scale_collapse_is_read(tmp_path, capsys):
    log = (
        "2024-01-14 01:03:00,113 WARNING [train.py:1057] (2/4) Grad scale is small: 1.2924697071141057e-26\n"
        "2024-01-14 01:03:00,115 WARNING [train.py:1057] (0/4) Grad scale is small: 1.2924697071141057e-26\n"
        "RuntimeError: grad_scale is too small, exiting: 1.2924697071141057e-26\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["check"] == "scaler-overflow"
    assert "The loss scale the scaler set is down to 1.2924697071141057e-26" in out
    assert "below 1: halved on overflow after overflow, far past any start" in " ".join(out.split())
