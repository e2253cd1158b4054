"""Issue 41, round 5: the classes of misreading found on a fifth set of reports doctor had never read (holdout5), each
on crafted input of its class in the stack's own format: a loss scaler's lines that print only the scale it set
(apex amp, NVIDIA DeepLearningExamples' DLLogger) (a), a warning that says in words a gradient norm is infinite (b),
DeepSpeed's logging rank and a scale stuck at its floor on every step (c), steps named in brackets, by MetricLogger's
`Epoch: [e]  [i/N]` and by the bars after a Trainer dict (d), and a CUDA out-of-memory error line (e). Each test fails
on round 4's doctor."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# a. a loss scaler's lines that print the scale it set: each one a skipped step, the series its trend

# DeepLearningExamples' BERT (run_pretraining.py take_optimizer_step): DLLogger's PARAMETER line on each overflow
_DLL = "".join(
    f"DLL 2021-03-01 10:{minute:02d}:00.000001 - PARAMETER loss_scale : {scale:.1f} \n"
    for minute, scale in ((1, 65536), (3, 32768), (9, 16384), (30, 8192))
)
_DLL = "DLL 2021-03-01 10:00:00.000001 - PARAMETER batch_size_per_gpu : 8 \n" + _DLL
# apex amp's own print (apex/amp/handle.py before amp was removed)
_APEX = "".join(
    f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {scale:.1f}\n"
    for scale in (32768, 16384, 8192)
)


def test_a_dllogger_loss_scale_line_is_a_skipped_step_and_its_series_a_trend(tmp_path, capsys):
    """Round 4: "The log has no error line and no metric line", benign."""
    doc, out = _doctor(tmp_path, capsys, _DLL)
    assert doc["failure"]["check"] == "scaler-overflow" and doc["failure"]["line"] == 2
    assert doc["summary"]["benign"] is None and doc["framework"]["name"] != "deepspeed"
    assert (
        "NVIDIA DeepLearningExamples' BERT trainer (DLLogger, apex amp's loss scaler) skipped a step on inf or NaN "
        "gradients (line 2, and 3 more such line(s); step skipped, loss scale -> 65536.0)." in out
    )
    assert (
        "The loss scale the scaler set falls from 65536 (2^16) to 8192 (2^13) over 4 overflow line(s) (the scale it "
        "attempted is not printed): steps with inf or NaN gradients keep coming, each one skipped." in out
    )
    assert (
        "DeepSpeed" not in out.split("the error (as the log printed it)")[0]
        and "Not a NaN failure by itself" not in out
    )


def test_a_apex_amp_lines_give_their_trend(tmp_path, capsys):
    """Round 4: the steps were read, the scale's fall was not said."""
    doc, out = _doctor(tmp_path, capsys, _APEX)
    assert doc["failure"]["check"] == "scaler-overflow"
    assert (
        "apex amp skipped a step on inf or NaN gradients (line 1, and 2 more such line(s); step skipped, loss scale -> "
        "32768.0 (apex amp's loss scaler 0, of one per loss))." in out
    )
    assert "The loss scale the scaler set falls from 32768 (2^15) to 8192 (2^13) over 3 overflow line(s)" in out


# DLLogger's training lines (DeepLearningExamples), all finite, the scale halving between two of them
_DLL_TRAINING = "".join(
    f"DLL 2021-03-01 10:0{i}:00.000001 - Training Epoch: 0 Training Iteration: {10 * i}  average_loss : 9.{9 - i}  "
    f"step_loss : 9.{8 - i}  learning_rate : 0.0006  loss_scale : {scale:.1f}\n"
    for i, scale in ((1, 131072), (2, 131072), (3, 65536))
)


def test_a_a_loss_scale_falling_on_finite_metric_lines_is_said(tmp_path, capsys):
    """Round 4: lines holding no NaN/Inf word were not read for their scale."""
    doc, out = _doctor(tmp_path, capsys, _DLL_TRAINING)
    assert doc["metrics"]["loss_scale_fall"] == {
        "from": 131072.0,
        "to": 65536.0,
        "line_before": 2,
        "step_before": 20,
        "line": 3,
        "step": 30,
    }
    assert (
        "The loss scale its metric lines print falls from 131072 (2^17) at line 2 (step 20) to 65536 (2^16) at line 3 "
        "(step 30): a dynamic loss scaler found inf or NaN gradients in between and skipped a step" in out
    )


# b. a line that says in words that a gradient norm or a loss is infinite or NaN

# CosyVoice's update_parameter_and_lr (wenet's words): the step skipped, the loss still printed
_COSYVOICE = (
    "2025-01-02 03:04:05,100 DEBUG TRAIN Batch 0/200 loss 2.345678 acc 0.312000 lr 0.00010000 grad_norm 3.210000 "
    "rank 0\n" + "2025-01-02 03:04:09,200 WARNING get infinite grad_norm, check your code/data if it appears "
    "frequently\n" * 3
)


def test_b_cosyvoice_infinite_grad_norm_is_a_skipped_step(tmp_path, capsys):
    """Round 4: "no non-finite value and no error found in 4 lines", benign."""
    doc, out = _doctor(tmp_path, capsys, _COSYVOICE)
    failure = doc["failure"]
    assert (failure["check"], failure["kind"], failure["line"], failure["fatal"]) == (
        "skip-nonfinite-grad",
        "NaN or Inf",
        2,
        False,
    )
    assert doc["summary"]["benign"] is None and doc["summary"]["metric"] == "grad_norm"
    assert (
        "CosyVoice's (and wenet's) trainer skipped an optimizer step on a non-finite gradient norm (line 2, and 2 more "
        "such line(s), all at one time stamp, 2025-01-02 03:04:09,200: several processes at once; grad_norm not "
        "finite (its check, torch.isfinite, fails on NaN and Inf alike): the step skipped)." in out
    )


def test_b_a_line_getting_a_nan_loss_names_its_step(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "epoch 1 step 57: get NaN loss, skip this batch\n")
    assert (doc["failure"]["check"], doc["failure"]["step"], doc["failure"]["kind"]) == ("nonfinite-message", 57, "NaN")
    assert "The log says a loss or a gradient went NaN or Inf at step 57 (line 1; get NaN loss)." in out


# c. DeepSpeed: the rank its lines name, and a scale at its floor on every step

_BAR = "  0%|▏                                     | {n}/9000 [00:{s:02d}<1:02:03,  2.41it/s]"
_FLOOR = "[2022-02-03 04:05:{s:02d},600] [INFO] [stage2.py:1628:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1\n"  # fmt: skip
_AT_FLOOR = _FLOOR.format(s=6) + "".join(_BAR.format(n=n, s=n - 30) + _FLOOR.format(s=n - 30) for n in (40, 41, 42))


def test_c_deepspeed_overflow_names_its_logging_rank(tmp_path, capsys):
    """Round 4: the rank was in the JSON's other_ranks only."""
    log = (
        "[2024-01-02 03:04:05,100] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
        "step. Attempted loss scale: 65536, reducing to 32768\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["failure"]["other_ranks"] == ["rank 0 logs it (DeepSpeed prints it on rank 0 only)"]
    assert "(line 1; loss scale 65536 -> 32768; rank 0 logs it (DeepSpeed prints it on rank 0 only))." in out


def test_c_every_line_at_the_floor_is_no_training(tmp_path, capsys):
    """Round 4: "the scale is at its floor", not that every step is skipped, nor which steps. Round 23: the first
    line's step is the bar right after it (tests/cli/test_doctor_classes23_scales.py, 4)."""
    doc, out = _doctor(tmp_path, capsys, _AT_FLOOR)
    assert doc["failure"]["check"] == "deepspeed-overflow" and doc["summary"]["benign"] is None
    assert (
        "All 4 overflow lines are at the floor; steps 40 to 43 in a row, the first at line 1 (the progress bar right "
        "after it, 40/9000: DeepSpeed prints it inside that step, before the loop moves its bar to it): each step "
        "they cover overflows and is skipped (persistent inf or NaN gradients, not a scale calibrating); how many "
        "steps still train, the run's own step counters say." in out  # round 29: not "the run does not train"
    )


# d. steps: in brackets, MetricLogger's epoch and iteration, a Trainer dict before the bars of the next logs

_LOGURU = "".join(
    f"2026-02-03 10:00:{i:02d}.000 | INFO     | app.logger:log:94 - [Step {step}] lr: 1.00e-04 | loss: {loss} | "
    f"grad_norm: {loss}\n"
    for i, (step, loss) in enumerate(((999, "0.25"), (1999, "nan"), (2999, "nan")))
)
# DeiT / BEiT / VideoMAE's MetricLogger.log_every: `Epoch: [e]  [i/N]`, each meter `value (running mean)`
_METRIC_LOGGER = "Start training for 30 epochs\n" + "".join(
    f"Epoch: [0]  [{i:>5}/2000]  eta: 1:00:00  lr: 0.000001  loss: 6.9{i % 10} (6.90)  loss_scale: {scale:.4f} "
    f"({scale:.4f})  grad_norm: {norm} (inf)  time: 1.0000  data: 0.5000  max mem: 30000\n"
    for i, scale, norm in ((0, 65536, "inf"), (10, 32768, "5.1234"), (20, 32768, "5.0123"))
)
# transformers' Trainer with a TensorBoard callback: the bar glued to the next log's warning, then that log's dict
_GLUED = (
    "NaN or Inf found in input tensor.\n"
    "{'loss': 2.5, 'grad_norm': nan, 'learning_rate': 1e-09, 'epoch': 0.0}\n"
    "  0%|          | 40/9000 [01:00<10:00:00,  4.00s/it]NaN or Inf found in input tensor.\n"
    "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 2e-09, 'epoch': 0.0}\n"
    "  0%|          | 60/9000 [02:00<10:00:00,  4.00s/it]NaN or Inf found in input tensor.\n"
    "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 3e-09, 'epoch': 0.0}\n"
)


def test_d_a_step_in_brackets(tmp_path, capsys):
    """Round 4: "the line names no step"."""
    doc, out = _doctor(tmp_path, capsys, _LOGURU)
    assert (doc["summary"]["metric"], doc["summary"]["step"]) == ("loss", 1999)
    assert "The first non-finite metric: loss at step 1999 (line 2), with " in out  # round 28: the others said


def test_d_a_first_reading_on_the_first_line_is_at_or_before_its_step(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _LOGURU.split("\n", 1)[1])
    assert doc["summary"]["step"] == 1999
    assert (
        "The first non-finite metric: loss at or before step 1999 (line 1: the input's first line, so an earlier "
        "step may have been non-finite too), with " in out
    )


def test_d_metric_logger_names_the_iteration_and_the_scale_falls(tmp_path, capsys):
    """Round 4: no step, and the loss scale's fall unsaid."""
    doc, out = _doctor(tmp_path, capsys, _METRIC_LOGGER)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["step_from"]) == (2, 0, "the line (the iteration within its epoch)")
    assert "The first non-finite metric: grad_norm at step 0 (line 2)." in out
    assert (
        "The loss scale its metric lines print falls from 65536 (2^16) at line 2 (step 0) to 32768 (2^15) at line 3 "
        "(step 10): a dynamic loss scaler found inf or NaN gradients in between and skipped a step (at a run's start, "
        "its scale calibrating)." in out
    )


def test_d_a_dict_before_glued_bars_is_one_interval_before_them(tmp_path, capsys):
    """Round 4: step 40, the bar after the dict, which was the next log's."""
    doc, out = _doctor(tmp_path, capsys, _GLUED)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"]) == (2, 20)
    assert first["step_from"].startswith("the progress bars after it, 40/9000 and 60/9000, are the next logs' steps")
    assert "The first non-finite metric: grad_norm at step 20 (line 2)." in out


# e. a CUDA out-of-memory error line: an error line, and not a NaN one

_OOM = (
    '[rank3]: Traceback (most recent call last):\n[rank3]:   File "/w/verl/workers/actor/dp_actor.py", line 300, in '
    "compute_log_prob\n[rank3]:     entropy = verl_F.entropy_from_logits(logits)\n"
    "[rank3]: {exc}: CUDA out of memory. Tried to allocate 9.50 GiB. GPU 3 has a total capacity of 79.11 GiB of "
    "which 1.25 GiB is free.\n"
)


@pytest.mark.parametrize("exc", ["torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError", "RuntimeError"])
def test_e_cuda_out_of_memory_is_an_error_line_not_a_nan(exc, tmp_path, capsys):
    """Round 4: "The traceback ends before its error line"."""
    doc, out = _doctor(tmp_path, capsys, _OOM.format(exc=exc))
    failure = doc["failure"]
    assert (failure["check"], failure["kind"], failure["rank"], failure["line"]) == ("out-of-memory", None, 3, 4)
    assert doc["summary"]["benign"] == (
        "an out-of-memory failure (CUDA out of memory), and no value the text prints is non-finite"
    )
    assert (
        f"On rank 3, the run ran out of GPU memory (torch's CUDA allocator) (line 4; {exc}; CUDA out of memory, tried "
        "to allocate 9.50 GiB, GPU 3 of 79.11 GiB (the process's local device index, not a global rank))." in out
    )
    assert "ends before its error line" not in out
