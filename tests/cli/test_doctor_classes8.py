"""Issue 41, round 8: the classes of misreading found on a ninth set of reports doctor had never read (holdout9),
each on crafted input of its class in the stack's own format: an error line glued onto a traceback frame's code line
(1), a NaN message glued after a progress record, ahead of the assert it led to (2), a line's own step over the bar
it holds (3), a per-line `epoch: N` counter (4), a bracketed list of names over a printed array of values (5), the
input's first record of a metric (6) and a loss scale collapsed below 1 (7). Each test fails on round 7's doctor."""

import time

import pytest

from nanscope.launch import epoch_steps, error_words, glued, named_arrays
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. an error line glued onto a frame's code line: stdout and stderr interleaved in a paste (mozilla/TTS#668,
# https://github.com/mozilla/TTS/issues/668: TTS/tts/layers/losses.py:398 `raise RuntimeError(f" [!] NaN loss with
# {key}.")`, its error line printed after the first frame's `    main(args)` with the newline lost)
_TTS = """Traceback (most recent call last):
  File "TTS/bin/train_tacotron.py", line 721, in <module>
    main(args)RuntimeError:  [!] NaN loss with postnet_loss.

  File "TTS/bin/train_tacotron.py", line 623, in main
    scaler_st)
  File "/content/TTS/tts/layers/losses.py", line 398, in forward
    raise RuntimeError(f" [!] NaN loss with {key}.")
"""


def test_1_error_line_glued_onto_a_frame_code_line(tmp_path, capsys):
    """Round 7: "The traceback ends before its error line"."""
    doc, out = _doctor(tmp_path, capsys, _TTS)
    failure = doc["failure"]
    assert (failure["check"], failure["line"], failure["kind"]) == ("nonfinite-error", 3, "NaN")
    assert "The run ended on an error naming NaN or Inf (line 3; RuntimeError; [!] NaN loss with postnet_loss.)" in out
    assert "ends before its error line" not in out
    assert doc["summary"]["metric"] == "postnet_loss"  # `NaN loss with {key}`: the loss it names


def test_1_a_glued_error_not_naming_nan_and_code_lines_are_no_nan_error(tmp_path, capsys):
    """A glued error whose message names no NaN is no NaN evidence; a frame's code line that calls an error's
    constructor or holds one in a string literal is no error line."""
    log = _TTS.replace("RuntimeError:  [!] NaN loss with postnet_loss.", "KeyError: 'postnet_loss'")
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["failure"]["check"] is None
    assert "The traceback ends before its error line" in out and "naming NaN" not in out
    assert glued.frame_error('    raise RuntimeError(f" [!] NaN loss with {key}.")') is None
    assert glued.frame_error('    check(x, "ValueError: nan")') is None
    assert glued.frame_error("main(args)RuntimeError: nan") is None  # not indented: no frame's code line


def test_1_glued_error_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert glued.frame_error("    " + ")" * 100_000) is None
    assert glued.frame_error("    " + ")A" * 50_000 + "Error") is None
    assert glued.frame_error("    )" + "Error" * 20_000) is None
    assert error_words.first_key("nan loss with 1" * 7_000) is None
    assert error_words.first_key("nan " + " loss " * 16_000) is None
    assert time.process_time() - started < 10


# 2. a NaN message glued after a progress record (babysor/MockingBird#330,
# https://github.com/babysor/MockingBird/issues/330: the synthesizer's `{| Epoch: E/N (b/B) | Loss: ... | }` record
# printed with end="" and its trainer's `grad_norm was NaN!` after it), then the CUDA assert of the next batch
_MOCKINGBIRD = (
    "{| Epoch: 12/1250 (8/8) | Loss: 2.645 | 0.68 steps/s | Step: 0k | }\n"
    "{| Epoch: 13/1250 (3/8) | Loss: 2.610 | 0.68 steps/s | Step: 0k | }grad_norm was NaN!\n"
    "{| Epoch: 13/1250 (4/8) | Loss: 2.596 | 0.68 steps/s | Step: 0k | }C:\\w\\b\\windows\\pytorch\\aten\\src\\ATen"
    "\\native\\cuda\\Loss.cu:115: block: [7,0,0], thread: [0,0,0] Assertion `input_val >= zero && input_val <= one` "
    "failed.\n"
)


def test_2_nan_message_glued_after_a_record_leads_before_the_assert(tmp_path, capsys):
    """Round 7: only the later BCE assert; the message under "also"."""
    doc, out = _doctor(tmp_path, capsys, _MOCKINGBIRD)
    assert (doc["failure"]["check"], doc["failure"]["line"]) == ("device-assert", 3)
    assert (
        "Before it, line 2 says grad_norm was NaN (epoch 13, batch 3/8: the progress record it is glued after): the "
        "first evidence of a non-finite value; the error after it may follow from it." in out
    )


def test_2_no_earlier_message_no_sentence(tmp_path, capsys):
    """The assert alone, or a message after it: nothing said before it."""
    lines = _MOCKINGBIRD.split("\n")
    doc, out = _doctor(tmp_path, capsys, "\n".join([lines[0], lines[2], lines[1]]) + "\n")
    assert doc["failure"]["line"] == 2
    assert "Before it, line" not in out


def test_2_record_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert glued._CLOSED.search("|" + " " * 100_000 + "}") is None
    assert glued._RECORD.search("Epoch: 1 " + "(1/" * 30_000) is None
    assert glued._RECORD.search("Epoch:" * 20_000) is None
    assert time.process_time() - started < 10


# 3. a line that names its own step, a bar after it and TensorBoard's warning glued on (ashawkey/RAD-NeRF#56,
# https://github.com/ashawkey/RAD-NeRF/issues/56: the trainer's tqdm bar_format `{desc}: {percentage:3.0f}% {n_fmt}/
# {total_fmt} [{elapsed}<{remaining}, {rate_fmt}]`, ashawkey/RAD-NeRF 4cb8fc6 nerf/utils.py, train_one_epoch; the
# reporter's description adds `local_step=N`; tensorboardX's `NaN or Inf found in input tensor.` glued after)
_NERF = (
    "loss=0.0136 (0.0136), lr=0.000460, local_step=1: :   0% 1/7272 [00:00<47:33,  2.55it/s]NaN or Inf found in "
    "input tensor.\n"
    "loss=nan (nan), lr=0.000460, local_step=2: :   0% 2/7272 [00:00<45:48,  2.64it/s]NaN or Inf found in input "
    "tensor.\n"
    "loss=nan (nan), lr=0.000460, local_step=3: :   0% 3/7272 [00:01<45:23,  2.67it/s]NaN or Inf found in input "
    "tensor.\n"
)


def test_3_the_step_a_line_names_wins_over_the_bar_before_it(tmp_path, capsys):
    """Round 7: "The first non-finite metric: loss at step 1 (line 2)"."""
    doc, out = _doctor(tmp_path, capsys, _NERF)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["step_from"]) == (2, 2, "the line")
    assert doc["summary"]["step"] == 2 and doc["failure"]["step"] == 1
    assert "The first non-finite metric: loss at step 2 (line 2)." in out


def test_3_without_a_step_of_its_own_the_warning_keeps_its_step(tmp_path, capsys):
    """No `local_step=` on the lines: the metric's step is the bar's, and the summary keeps the warning's."""
    doc, out = _doctor(tmp_path, capsys, _NERF.replace(", local_step=1", "").replace(", local_step=2", ""))
    assert doc["metrics"]["first_nonfinite"]["step_from"] != "the line"
    assert doc["summary"]["step"] == 1


# 4. a per-line epoch counter (vpetren/gradnorm_tf#17, https://github.com/vpetren/gradnorm_tf/issues/17: the loop's
# `print('epoch:', it, 'loss:', costtr[-1])`, vpetren/gradnorm_tf 0493672 gradnorm_tf.py, one line per epoch)
_GRADNORM = "".join(f"epoch: {n} loss: 0.21{n}\n" for n in range(3446, 3451)) + "epoch: 3451 loss: nan\n"


def test_4_a_per_line_epoch_counter_is_the_step(tmp_path, capsys):
    """Round 7: "loss (the line names no step)"."""
    doc, out = _doctor(tmp_path, capsys, _GRADNORM)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["metric"]) == (6, 3451, "loss")
    assert first["step_from"] == "the line (its epoch counter, one more on each line before it)"
    assert "The first non-finite metric: loss at step 3451 (line 6)." in out


def test_4_an_epoch_that_does_not_rise_by_one_a_line_is_no_step(tmp_path, capsys):
    """Several lines per epoch (or a gap): the epoch says nothing of the step."""
    log = "".join(f"epoch: {n // 2} loss: 0.21{n}\n" for n in range(10, 16)) + "epoch: 8 loss: nan\n"
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["first_nonfinite"]["step"] is None
    assert "The first non-finite metric: loss (the line names no step; epoch 8)" in out


def test_4_epoch_counter_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert epoch_steps.step("epoch" + " " * 100_000 + "1", [1, 2, 3]) is None
    assert epoch_steps.step("epoch:" * 20_000, [1, 2, 3]) is None
    assert epoch_steps.step("epoch: " + "9" * 100_000, [1, 2, 3]) is None
    assert time.process_time() - started < 10


# 5. a bracketed list of names over numpy's printed array of their values (ksw0306/ClariNet#7,
# https://github.com/ksw0306/ClariNet/issues/7: train_student.py `print('Global Step : {}, [{}, {}] [Total Loss, KL
# Loss, Reg Loss, Frame Loss] : {}'.format(global_step, epoch, batch_idx + 1, np.array(running_loss)))`)
_CLARINET = (
    "Global Step : 67338, [54, 900] [Total Loss, KL Loss, Reg Loss, Frame Loss] : [ 4.1021  1.2003  2.301   0.6 ]\n"
    "100 Step Time : 143.40849208831787\n"
    "Global Step : 67438, [55, 100] [Total Loss, KL Loss, Reg Loss, Frame Loss] : [  nan   nan 2.301   nan]\n"
)


def test_5_names_over_a_printed_array_name_each_value(tmp_path, capsys):
    """Round 7: the metric named "nan"."""
    doc, out = _doctor(tmp_path, capsys, _CLARINET)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["metric"]) == (3, 67438, "Total Loss")
    assert first["values"] == [["Total Loss", "nan"], ["KL Loss", "nan"], ["Frame Loss", "nan"]]
    assert first["finite"] == {"Reg Loss": 2.301}
    # round 10 named the total's first non-finite term; round 28: the total, with its terms (test_doctor_classes10 4)
    assert "The first non-finite metric: Total Loss at step 67438 (line 3), with KL Loss, Frame Loss non-finite" in out


def test_5_names_and_values_not_as_many_are_not_paired(tmp_path, capsys):
    """Three names over four values (or a list of numbers in brackets): no value named by position."""
    assert named_arrays.read("[Total Loss, KL Loss, Reg Loss] : [nan nan 2.3 nan]") == []
    assert named_arrays.read("[55, 100] : [nan nan]") == []
    assert named_arrays.read("[Total Loss, KL Loss] : [abc nan]") == []
    assert named_arrays.read("Step : 5 [Loss, Acc] : [nan 0.5]") == [
        ("Step", "5", 7),
        ("Loss", "nan", 24),
        ("Acc", "0.5", 28),
    ]


def test_5_named_array_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert named_arrays.read("[a" * 50_000 + "] : [") == []
    assert named_arrays.read("[" + "a, " * 33_000 + "] : [" + "1 " * 300) == []
    assert named_arrays.read("[a, b] : [" + "1" * 100_000) == []
    assert named_arrays.read("] " + "Step :" * 20_000) == []
    assert time.process_time() - started < 10


# 6. the input's first record of a metric (hiyouga/LlamaFactory#6286,
# https://github.com/hiyouga/LlamaFactory/issues/6286: LlamaFactory's LogCallback line `llamafactory.train.callbacks:157
# >> {'loss': ...}` holds no grad_norm; the Trainer's ProgressCallback.on_log writes `str(logs)` with it, then the bar)
_LLAMAFACTORY = (
    "[INFO|2024-12-08 01:09:59] llamafactory.train.callbacks:157 >> {'loss': 0.0000, 'learning_rate': 4.9985e-05, "
    "'epoch': 0.03}\n"
    "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.998452110450943e-05, 'epoch': 0.03}\n"
    "  1%|█▍         | 75/6249 [08:38<11:33:05,  6.74s/it][INFO|2024-12-08 01:10:34] llamafactory.train.callbacks:157 "
    ">> {'loss': 0.0000, 'learning_rate': 4.9982e-05, 'epoch': 0.04}\n"
    "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.998223113110496e-05, 'epoch': 0.04}\n"
    "  1%|█▌         | 80/6249 [09:17<13:46:10,  8.04s/it][INFO|2024-12-08 01:11:13] llamafactory.train.callbacks:157 "
    ">> {'loss': 0.0000, 'learning_rate': 4.9980e-05, 'epoch': 0.04}\n"
    "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.9979783305842495e-05, 'epoch': 0.04}\n"
)


def test_6_the_inputs_first_record_of_a_metric_is_at_or_before_its_step(tmp_path, capsys):
    """Round 7: "grad_norm at step 70 (line 2)"."""
    doc, out = _doctor(tmp_path, capsys, _LLAMAFACTORY)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["metric"]) == (2, 70, "grad_norm")
    assert (
        "The first non-finite metric: grad_norm at or before step 70 (line 2: the input's first record of grad_norm, "
        "so an earlier step may have been non-finite too)." in out
    )


def test_6_a_finite_record_of_the_metric_before_it_keeps_its_step(tmp_path, capsys):
    """A record holding grad_norm finite before it: the onset is in the input, its step said as is."""
    finite = "{'loss': 0.9, 'grad_norm': 1.5, 'learning_rate': 4.9986e-05, 'epoch': 0.02}\n"
    doc, out = _doctor(tmp_path, capsys, finite + _LLAMAFACTORY)
    assert doc["metrics"]["first_nonfinite"]["line"] == 3
    assert "at or before" not in out and "The first non-finite metric: grad_norm at step 70 (line 3)." in out


# 7. apex amp's scaler halving with no floor, down below 1 (Junjue-Wang/FactSeg#6,
# https://github.com/Junjue-Wang/FactSeg/issues/6: apex before cb65b8ed apex/amp/handle.py:138 prints `Gradient
# overflow.  Skipping step, loss scaler {} reducing loss scale to {}`; tensorboardX's warning before it)
_APEX = "Warning: NaN or Inf found in input tensor.\n" + "".join(
    f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {scale}\n"
    for scale in ("2.0237e-320", "2.0237e-320", "1.012e-320", "1.012e-320", "5.06e-321")
)


def test_7_a_loss_scale_collapsed_below_1_leads_the_verdict(tmp_path, capsys):
    """Round 7: TensorBoard's warning led; the scale storm only under "also"."""
    doc, out = _doctor(tmp_path, capsys, _APEX)
    assert (doc["failure"]["check"], doc["failure"]["line"]) == ("scaler-overflow", 2)
    assert "apex amp skipped a step on inf or NaN gradients (line 2, and 4 more such line(s);" in out
    assert "The loss scale the scaler set is down to 5.06e-321 (5 overflow line(s), from 2.0237e-320), below 1:" in out
    assert "also: logged-nonfinite at line 1" in out


def test_7_a_scale_still_above_1_does_not_lead(tmp_path, capsys):
    """A scale halving from 2^16 (a run's start): the warning before it keeps the lead."""
    log = _APEX.replace("2.0237e-320", "32768.0").replace("1.012e-320", "16384.0").replace("5.06e-321", "8192.0")
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["failure"]["check"], doc["failure"]["line"]) == ("logged-nonfinite", 1)
    assert "below 1" not in out
