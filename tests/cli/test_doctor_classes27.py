"""Issue 41, round 27: the false reading of holdout27 (2 reports of transformers' Trainer doctor had never read,
graded on da0fe1c), on crafted input of its class; the positive test fails on that commit."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# an evaluation's NaN loss after the run's one step, its training loss finite (josepuga/oq-falcon-training's README,
# holdout27 02): a training loss is computed before its step's update, the evaluation after, so the weights it ran on
# are not cleared by it; the end-of-run dict's `train_loss` (an average of those) does not clear them either
def test_an_evaluation_s_nan_after_the_last_step_may_be_the_weights(tmp_path, capsys):
    log = (
        "{'loss': 6.039, 'grad_norm': 3.1, 'learning_rate': 5e-05, 'epoch': 1.0}\n"
        "{'eval_loss': nan, 'eval_runtime': 107.7586, 'epoch': 1.0}\n"
        "{'train_runtime': 993.8091, 'train_loss': 6.0390625, 'epoch': 1.0}\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["first_nonfinite"]["metric"] == "eval_loss"
    assert "the evaluation, or weights the update before it made non-finite" in out
    assert "the evaluation only" not in out


def test_a_finite_training_loss_of_a_later_step_clears_the_weights(tmp_path, capsys):
    log = "step 10 | loss 6.039 | grad_norm 3.1\nstep 10 | eval_loss nan | eval_acc 0.5\nstep 20 | loss 5.9 | grad_norm 2.8\n"
    _, out = _doctor(tmp_path, capsys, log)
    assert "the evaluation only: a loss on held-out data, no backward pass behind it" in out
    assert "the training loss logged after it (line 3, step 20) is finite, so the weights were" in out


def test_a_zero_loss_or_one_of_no_step_does_not(tmp_path, capsys):
    log = "step 10 | eval_loss nan | eval_acc 0.5\nstep 20 | loss 0.0 | lr 1\nEpoch 1: train_epoch_loss=1.0937\n"
    _, out = _doctor(tmp_path, capsys, log)
    assert "the evaluation, or weights the update before it made non-finite" in out


# a training loss logged after it non-finite (`Epoch 3/50 | Train Loss: nan` after `Epoch 2/50 | ... | Val Loss:
# nan`, holdout22 04): the weights
def test_a_nonfinite_training_loss_after_it_points_to_the_weights(tmp_path, capsys):
    log = (
        "Epoch 1/50 | Train Loss: 0.4974 | Val Loss: 2.1927 | Val Acc: 0.0000\n"
        "Epoch 2/50 | Train Loss: 0.7663 | Val Loss: nan | Val Acc: 1.0000\n"
        "Epoch 3/50 | Train Loss: nan | Val Loss: nan | Val Acc: 1.0000\n"
    )
    _, out = _doctor(tmp_path, capsys, log)
    assert (
        "the weights, not the evaluation alone: the next training loss logged after it is non-finite too (line 3" in out
    )


# one line's training loss beside the NaN evaluation: nanoGPT's `step N: train loss X, val loss Y` estimates both on
# the same weights (estimate_loss), an epoch's `Train Loss | Val Loss` averages the losses of its steps, before the
# updates the evaluation ran after
def test_nanogpt_s_train_loss_beside_it_clears_an_epoch_s_average_does_not(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, "step 500: train loss 2.1034, val loss nan\n")
    assert "the line's train loss, estimated with the same weights (nanoGPT's estimate_loss runs both splits)" in out
    _, out = _doctor(tmp_path, capsys, "Epoch 2/50 | Train Loss: 0.7663 | Val Loss: nan | Val Acc: 1.0000\n")
    assert "the evaluation, or weights the update before it made non-finite" in out


# the review's cases: the next training loss decides once; a restarted run's lines, a same-step loss of another loop,
# a NaN far later decide nothing
@pytest.mark.parametrize(
    "log",
    [
        "step 100 | val_loss nan | val_acc 0.1\nstep 50 | loss 2.0 | lr 1\nstep 120 | loss 2.0 | lr 1\n",
        "val_loss=nan val_acc=0.1\nloss=2.0 lr=1\nloss=2.1 lr=1\nloss=nan lr=1\n",
        "Step 100: val_loss=nan val_acc=0.1\nStep 100: loss=2.0 lr=1\n",
    ],
    ids=["restarted", "nan-far-later", "same-step"],
)
def test_only_the_next_training_loss_of_a_later_step_decides(tmp_path, capsys, log):
    _, out = _doctor(tmp_path, capsys, log)
    assert "the evaluation, or weights the update before it made non-finite" in out


def test_mlx_s_train_report_of_the_evaluated_iteration_clears(tmp_path, capsys):
    log = "Iter 10: Val loss nan, Val took 2.1s\nIter 10: Train loss 0.512, Learning Rate 1.000e-05, It/sec 0.2\n"
    _, out = _doctor(tmp_path, capsys, log)
    assert "the training loss logged after it (line 2, step 10) is finite, so the weights were" in out


# a caption over a record of `key: value` lines gives their step too
def test_a_caption_over_key_value_lines_gives_their_step(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "Eval metrics at step 6:\n  eval_loss: nan\n  eval_acc: 0.1\n")
    assert doc["metrics"]["first_nonfinite"]["step"] == 6


# the watch for the training loss after an evaluation-only reading keeps the episodes' watch of its own key (an
# evaluation metric with no `loss` in its name, finite again, then not)
def test_an_evaluation_metric_s_second_episode_is_still_said(tmp_path, capsys):
    log = "step 1 | eval_acc nan | eval_f1 0.1\nstep 2 | eval_acc 0.5 | eval_f1 0.2\nstep 3 | eval_acc nan | eval_f1 0.1\n"
    _, out = _doctor(tmp_path, capsys, log)
    assert "non-finite again at step 3 (line 3)" in out
