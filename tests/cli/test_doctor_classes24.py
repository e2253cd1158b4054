"""Issue 41, round 24: the classes of holdout24 (reports doctor had never read, graded on b4c9509) that live in the
metric lines, on crafted input of each class; each positive test fails on b4c9509 (the loss scaler's and torch
elastic's classes: test_doctor_classes24_scaler.py; the frames': test_doctor_classes24_frames.py)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. a Trainer dict pretty-printed a key a line (huggingface/transformers#31997, holdout24 03): one record, its finite
# loss beside its NaN gradient norm the backward pass, its keys transformers'
def test_1_a_dict_printed_a_key_a_line_is_one_record(tmp_path, capsys):
    log = "{\n    'loss': 2.3101,\n    'grad_norm': nan,\n    'learning_rate': 4e-06,\n    'epoch': 0.03\n}\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "transformers"
    assert doc["metrics"]["first_nonfinite"]["finite"] == {"loss": 2.3101}
    assert doc["summary"]["points_to"].startswith("the backward pass: the loss on the line is finite")


def test_1_a_dict_cut_before_its_close_is_read_line_by_line(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "{\n    'loss': 0.0,\n    'grad_norm': nan,\n    'learning_rate': 8.0")
    assert doc["metrics"]["first_nonfinite"]["finite"] == {}


# 2. lit-gpt's `iter N step M` (Lightning-AI/litgpt#185, holdout24 02): iter counts micro-batches, step the optimizer's
# steps done; the step said with both
def test_2_a_micro_batch_iteration_beside_the_optimizer_s_steps(tmp_path, capsys):
    log = "".join(f"iter {i} step {i // 16}: loss 1.9{i % 10}, train time: 1410.41ms\n" for i in range(14, 16))
    log += "iter 16 step 1: loss nan, train time: 1410.41ms\n"
    doc, out = _doctor(tmp_path, capsys, log)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["step"], first["step_from"]) == (
        16,
        "the line's iter, each micro-batch; its step 1 counts the optimizer's steps done",
    )


def test_2_a_step_beside_a_smaller_iter_is_no_micro_batch(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "step 40 iter 3: loss nan\n")
    assert doc["metrics"]["first_nonfinite"]["step_from"] == "the line"
