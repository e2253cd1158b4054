"""Issue 41, round 8: the classes of misreading found on a tenth set of reports doctor had never read (holdout10),
each on crafted input of its class in the stack's own format: an error saying a value is `not finite` (1), Keras's
epoch line and Progbar (2), the counters an ad hoc loop prints beside its metrics (3), metric names written with
spaces (4) and a JSON record's message naming NaN (5). Each test fails on round 7's doctor."""

import time

import pytest

from nanscope.launch import loop_counters, said_errors
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. a value said to be `not finite`

# SpeechBrain's Brain.check_gradients (mid-2022 speechbrain/core.py; check_loss_isfinite in later releases) raises
# ValueError("Loss is not finite and patience is exhausted. To debug, wrap `fit()` with autograd's
# `detect_anomaly()`, e.g.\n\nwith torch.autograd.detect_anomaly():\n\tbrain.fit(...)")
# (https://github.com/speechbrain/speechbrain/issues/1462)
_SPEECHBRAIN = """speechbrain.core - ERROR - Exception:
Traceback (most recent call last):
  File "recipes/TIMIT/ASR/CTC/train.py", line 240, in <module>
    asr_brain.fit(
  File "speechbrain/core.py", line 1153, in fit
    self._fit_train(train_set=train_set, epoch=epoch, enable=enable)
  File "speechbrain/core.py", line 930, in check_gradients
    raise ValueError(
ValueError: Loss is not finite and patience is exhausted. To debug, wrap `fit()` with autograd's `detect_anomaly()`, e.g.

with torch.autograd.detect_anomaly():
\tbrain.fit(...)
"""


def test_1_speechbrain_loss_not_finite_is_an_error_naming_a_nonfinite_value(tmp_path, capsys):
    """Round 7: exit 2, "no Megatron error found"."""
    doc, out = _doctor(tmp_path, capsys, _SPEECHBRAIN)
    failure = doc["failure"]
    assert (failure["check"], failure["op"], failure["line"]) == ("nonfinite-error", "ValueError", 9)
    assert doc["summary"]["metric"] == "loss"
    assert "The run ended on an error naming NaN or Inf (line 9; ValueError; Loss is not finite and patience" in out


# torch.nn.utils.clip_grad_norm_(..., error_if_nonfinite=True) (torch 2.13 torch/nn/utils/clip_grad.py:110-115):
# RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be
# clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
_CLIP = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 88, in <module>\n'
    "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)\n"
    "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be clipped. "
    "To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`\n"
)


def test_1_clip_grad_norm_non_finite_error_names_the_gradient_norm(tmp_path, capsys):
    """Round 7: "The traceback ends before its error line"."""
    doc, out = _doctor(tmp_path, capsys, _CLIP)
    failure = doc["failure"]
    assert (failure["check"], failure["op"], failure["line"]) == ("nonfinite-error", "RuntimeError", 4)
    assert doc["summary"]["metric"] == "grad_norm"
    assert "The run ended on an error naming NaN or Inf (line 4; RuntimeError; The total norm of order 2.0" in out


def test_1_subject_of_a_not_finite_message():
    assert said_errors.subject("Loss is not finite and patience is exhausted.") == "loss"
    assert said_errors.subject("Parameter is not finite: tensor([nan])") is None
    assert said_errors.subject("loss finite; weights checked, all non-finite values masked") is None


# Keras TerminateOnNaN.on_batch_end prints f"Batch {batch}: Invalid loss, terminating training" where the batch's
# loss is NaN or Inf (keras-team/keras keras/src/callbacks/terminate_on_nan.py; keras 2 keras/callbacks.py), onto
# the Progbar line it interrupts (https://github.com/manishsoni1908/Mobilenet-ssd-keras/issues/21)
_TERMINATE = """Epoch 1/20
  5/120 [>.............................] - ETA: 2:11:40 - loss: 18.2231Batch 5: Invalid loss, terminating training
"""


def test_1_keras_terminate_on_nan_is_a_message_at_its_batch(tmp_path, capsys):
    """Round 7: the line holds no NaN word: "no non-finite value and no error found"."""
    doc, out = _doctor(tmp_path, capsys, _TERMINATE)
    failure = doc["failure"]
    assert (failure["check"], failure["op"], failure["step"], failure["line"]) == (
        "nonfinite-message",
        "TerminateOnNaN",
        6,  # round 10: `Batch 5` is Keras's 0-based index, the progress bar's 6/120 (test_doctor_classes10 3)
        2,
    )
    assert doc["summary"]["metric"] == "loss"
    assert "Keras's TerminateOnNaN: the loss of batch index 5 is NaN or Inf; training stopped" in out


def test_1_a_nonfinite_word_without_saying_is_no_evidence(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "config: skip_non-finite batches, non-finite check enabled\n")
    assert doc["summary"]["kind"] is None and doc["summary"]["check"] is None


# 2. Keras's epoch line and Progbar (keras 1.x/2.x keras/utils/generic_utils.py Progbar.update: `current/target`,
# the `[===>...]` bar, ` - ETA: %ds` inside the epoch or ` - %ds` at its end, then ` - %s: %.4f` per metric; fit
# prints `Epoch %d/%d` before each epoch's bar; https://github.com/alexander-rakhlin/CNN-for-Sentence-Classification-
# in-Keras/issues/7, https://github.com/matterport/Mask_RCNN/issues/1162)
_KERAS_EPOCHS = """Epoch 1/8
4000/4000 [==============================] - 3s - loss: 0.6531 - acc: 0.6012 - val_loss: 0.5911 - val_acc: 0.7010
Epoch 2/8
4000/4000 [==============================] - 3s - loss: 0.5120 - acc: 0.7480 - val_loss: 0.5004 - val_acc: 0.7650
Epoch 3/8
4000/4000 [==============================] - 3s - loss: nan - acc: 0.4920 - val_loss: nan - val_acc: 0.0000e+00
Epoch 4/8
4000/4000 [==============================] - 3s - loss: nan - acc: 0.0000e+00 - val_loss: nan - val_acc: 0.0000e+00
"""


def test_2_keras_finished_bar_is_its_epoch(tmp_path, capsys):
    """Round 7: "loss (the line names no step)"."""
    doc, out = _doctor(tmp_path, capsys, _KERAS_EPOCHS)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["epoch"], first["metric"]) == (6, None, "3", "loss")
    assert "The first non-finite metric: loss (the line names no step; epoch 3) (line 6)" in out  # round 29: an
    # epoch is no step


_KERAS_BAR = (
    "Epoch 1/40\n"
    " 11/500 [..............................] - ETA: 51:12 - loss: 3.1210 - rpn_class_loss: 0.4011\n"
    " 12/500 [..............................] - ETA: 50:40 - loss: nan - rpn_class_loss: 0.4102\n"
)


def test_2_keras_bar_inside_its_epoch_is_its_batch(tmp_path, capsys):
    """Round 7: "loss (the line names no step)"."""
    doc, _ = _doctor(tmp_path, capsys, _KERAS_BAR)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["step_from"]) == (
        3,
        12,
        "the line (Keras's progress bar 12/500: batch 12 of epoch 1)",
    )


# 3. an ad hoc loop's counters
@pytest.mark.parametrize(
    ("log", "line", "step"),
    [
        # DLLXW/baby-llama2-chinese pretrain.py: logger.info('Epoch:[{}/{}]({}/{}) loss:{:.3f} lr:{:.7f} ...')
        # (https://github.com/DLLXW/baby-llama2-chinese/issues/17)
        (
            "[pretrain.py][INFO] Epoch:[1/3](400/9000) loss:5.100 lr:0.0001\n"
            "[pretrain.py][INFO] Epoch:[1/3](500/9000) loss:nan lr:0.0001\n",
            2,
            500,
        ),
        # HAKE-Action-Torch: `'%03d epoch, %05d iter, average time %.4f, loss %.4f'`
        # (https://github.com/DirtyHarryLYL/HAKE-Action-Torch/issues/34)
        (
            "001 epoch, 01000 iter, average time 0.6100, loss 12.5000\n"
            "001 epoch, 01500 iter, average time 0.6200, loss nan\n",
            2,
            1500,
        ),
        # DeblurGAN-tf: `'%d epoch,  %d  batch, Discriminator  Loss:  %f'` (https://github.com/LeeDoYup/DeblurGAN-tf/issues/11)
        (
            "[INFO] 2 epoch,  77  batch, Discriminator  Loss:  9.500000\n"
            "[INFO] 2 epoch,  78  batch, Discriminator  Loss:  nan\n",
            2,
            78,
        ),
    ],
)
def test_3_a_loop_s_counter_next_to_its_number_is_the_step(log, line, step, tmp_path, capsys):
    """Round 7: "(the line names no step)"."""
    doc, _ = _doctor(tmp_path, capsys, log)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"]) == (line, step)


@pytest.mark.parametrize(
    "log, line, epoch",
    [
        # golbin/TensorFlow-Tutorials GAN: print('Epoch:', '%04d' % epoch, 'D loss: {:.4}'.format(loss_val_D), ...)
        # (https://github.com/golbin/TensorFlow-Tutorials/issues/42)
        ("Epoch: 0041 D loss: -0.41 G loss: -2.9\nEpoch: 0042 D loss: nan G loss: nan\n", 2, "0042"),
        # apoorvnandan/speech-recognition-primer: print("Epoch    : ", epoch) then print("LOSS     : ", loss)
        # (https://github.com/apoorvnandan/speech-recognition-primer/issues/2)
        ("Epoch    :  3\nLOSS     :  31.0525\n\nEpoch    :  4\nLOSS     :  nan\n", 5, "4"),
    ],
)
def test_3_a_loop_s_only_counter_an_epoch_is_its_epoch(log, line, epoch, tmp_path, capsys):
    """Round 29: an epoch is no step (holdout19 03)."""
    doc, _ = _doctor(tmp_path, capsys, log)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["epoch"]) == (line, None, epoch)


def test_3_the_finer_counter_wins_and_a_count_of_epochs_is_no_step():
    assert loop_counters.step_of("000 epoch, 06000 iter, average time 0.66, loss nan", []) == (
        6000,
        "the line (iter 06000: its iter counter)",
        False,
    )
    assert loop_counters.step_of("Epoch: 0564 D loss: nan G loss: nan", []) == (
        564,
        "the line (epoch 0564: the epoch is the unit: its only counter)",
        True,
    )
    assert loop_counters.step_of("training for 10 epochs, loss nan", []) is None
    assert loop_counters.step_of("time/time/step=467 loss=nan", []) is None
    assert loop_counters.step_of("loss nan", ["Epoch 2/10 done in 3 s", "warmup"]) is None


# 4. names with spaces
def test_4_spaced_names_and_the_gan_model_they_name(tmp_path, capsys):
    """Round 7: the metrics "Loss" and "loss, loss"."""
    doc, out = _doctor(tmp_path, capsys, "[INFO] 0 epoch,  9  batch, Discriminator  Loss:  nan\n")
    first = doc["metrics"]["first_nonfinite"]
    assert (first["metric"], first["model"], first["step"]) == ("Discriminator Loss", "discriminator", 9)
    doc, out = _doctor(tmp_path, capsys, "Epoch: 0042 D loss: nan G loss: nan\n")
    first = doc["metrics"]["first_nonfinite"]
    assert (first["values"], first["model"]) == ([["D loss", "nan"], ["G loss", "nan"]], None)
    doc, out = _doctor(tmp_path, capsys, "Epoch: 0042 D loss: 0.31 G loss: nan\n")
    first = doc["metrics"]["first_nonfinite"]
    assert (first["values"], first["model"]) == ([["G loss", "nan"]], "generator")
    assert "The first non-finite metric: G loss (generator) (the line names no step; epoch 0042) (line 1" in out


def test_4_each_value_keeps_its_own_name_in_the_line_s_order(tmp_path, capsys):
    """A spaced name after a plain one: the plain one keeps its key (truncated-diffusion's `loss: nan, implicit loss:
    nan`, https://github.com/JegZheng/truncated-diffusion-probabilistic-models/issues/3)."""
    doc, _ = _doctor(tmp_path, capsys, "Epoch: 0, step: 5, loss: nan, implicit loss: nan, data time: 0.02\n")
    first = doc["metrics"]["first_nonfinite"]
    assert (first["values"], first["step"]) == ([["loss", "nan"], ["implicit loss", "nan"]], 5)


def test_4_a_counter_word_before_a_loss_is_no_name(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "step 12, train loss: nan, val loss: 1.5\n")
    assert doc["metrics"]["first_nonfinite"]["values"][0][0] != "step loss"


# 5. a JSON record's message: AWS DeepRacer's training_worker logs its exception as a `simapp_exception` record
# (https://github.com/ARCC-RACE/deepracer-for-dummies/issues/50)
_JSON = (
    '{"simapp_exception": {"version": "1.0", "date": "2020-01-02 10:00:00.1", "function": "training_worker", '
    '"message": "NaN detected in loss function, aborting training. Job failed!", "exceptionType": '
    '"training_worker.exceptions", "eventType": "system_error", "errorCode": "503"}}\n'
)


def test_5_json_message_naming_nan_is_an_error_not_a_metric(tmp_path, capsys):
    """Round 7: the metric `message`."""
    doc, out = _doctor(tmp_path, capsys, _JSON)
    failure = doc["failure"]
    assert (failure["check"], failure["op"], failure["kind"]) == ("nonfinite-error", "simapp_exception", "NaN")
    assert doc["summary"]["metric"] == "loss"
    assert "a JSON log record's message: NaN detected in loss function, aborting training. Job failed!" in out


def test_5_json_messages_that_say_nothing_non_finite_are_none():
    assert said_errors.json_message('{"level": "info", "message": "nan guard enabled"}') is None
    assert said_errors.json_message('{"level": "info", "message": "loss is finite again"}') is None
    signal, fields = said_errors.json_message('{"level": "warning", "message": "grad norm is inf, step skipped"}')
    assert (signal.id, fields["value"]) == ("nonfinite-message", "Inf")


def test_new_readers_are_linear_on_a_100kb_line():
    started = time.process_time()
    for line in ("epoch " * 20_000, "1 " * 50_000 + "x", "Epoch:[" * 15_000, "a " * 50_000 + "loss: x",
                 " " * 100_000 + "loss: nan", "[" + " " * 100_000):  # fmt: skip
        loop_counters.step_of(line, [line, line])
        loop_counters._own(line)
        for pattern in (loop_counters._KEYED, loop_counters._HEAD, loop_counters._PROGBAR, loop_counters._ALONE):
            pattern.search(line[:4096])
    for line in ('"message": "' + "\\a" * 50_000, '"message": "' + "nan is " * 15_000, '"' + "a" * 100_000 + '": '):
        said_errors.json_message(line)
        said_errors.terminate_on_nan("Batch " + line)
        said_errors.subject("loss " + line + " is")
    assert time.process_time() - started < 10
