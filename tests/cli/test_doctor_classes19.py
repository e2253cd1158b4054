"""Issue 41, round 19: what the consumed holdouts still read only partly, and the classes of holdout19 (reports doctor
had never read), on crafted input of each class. Each test fails on round 18's doctor (main e19a80e)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")


# 1. a split's word before the metric (nanoGPT's `step N: train loss X, val loss Y`, holdout17 21): both keys said
def test_1_a_split_word_stays_with_its_metric(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "step 100000: train loss nan, val loss nan\n")
    assert doc["summary"]["metric"] == "train loss"
    assert "step 100000 (the line): train loss nan, val loss nan" in out


def test_1_a_validation_loss_alone_is_the_evaluation(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "step 500: train loss 2.1034, val loss nan\n")
    assert doc["summary"]["metric"] == "val loss"
    assert "the evaluation only: a loss on held-out data" in out


@pytest.mark.parametrize("line", ["pretrain loss nan", "step 3: loss nan"])
def test_1_no_split_word_leaves_the_key(tmp_path, capsys, line):
    doc, _ = _doctor(tmp_path, capsys, line + "\n")
    assert doc["summary"]["metric"] == "loss"


# 2. a tensor printed at a debugger's prompt (huggingface/trl#435: `(Pdb++) rewards_j` then `tensor([[nan]], ...`):
# the prompt's expression names it
@pytest.mark.parametrize("prompt, name", [("(Pdb++) rewards_j", "rewards_j"), ("ipdb> p loss", "loss"),
                                          (">>> out.logits", "out.logits")])  # fmt: skip
def test_2_a_prompt_names_the_tensor_it_printed(tmp_path, capsys, prompt, name):
    text = f"{prompt}\ntensor([[nan]], device='cuda:0', dtype=torch.bfloat16,\n       grad_fn=<AddBackward0>)\n"
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["metric"] == name
    assert f"{name} (printed at the prompt on the line before): its values nan" in out


def test_2_a_debugger_command_names_nothing(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "(Pdb) c\ntensor([[nan]], device='cuda:0')\n")
    assert "printed at the prompt" not in out
    assert doc["summary"]["metric"] in (None, "-")
