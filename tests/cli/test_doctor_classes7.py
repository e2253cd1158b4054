"""Issue 41, round 7: the classes of misreading found on an eighth set of reports doctor had never read (holdout8),
each on crafted input of its class in the stack's own format: the key-value tables of openai-baselines' logger and
the stable-baselines that copied it (1), steps named by mmcv's logger, a loop's `iteration N/M` line and a bar glued
before an error (2), a CUDA assert's rank from the `[rankN]:` traceback after it (3), a Python warning naming NaN (4),
torch.distributions' validation error (5), a named printed tensor (6), a Trainer dict's step from the bar redrawn
after it (7) and an error's keys as written (8). Each test fails on round 6's doctor."""

import time

import pytest

from nanscope.launch import error_words, logger_tables, loop_lines
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. the logger's table: one dump, one record

# stable-baselines (v2) PPO2: logger.logkv("n_updates", update) (hill-a/stable-baselines 259f278
# stable_baselines/ppo2/ppo2.py:394), written by HumanOutputFormat.writekvs (stable_baselines/logger.py:90), the
# keys sorted, between rules of dashes
_SB2 = """---------------------------------
| approxkl           | 0.0527   |
| clipfrac           | 0.391    |
| explained_variance | 0.0262   |
| fps                | 17       |
| n_updates          | 29       |
| policy_entropy     | 6.77     |
| policy_loss        | 0.0166   |
| serial_timesteps   | 59392    |
| total_timesteps    | 237568   |
| value_loss         | 3.74e+06 |
---------------------------------
---------------------------------
| approxkl           | nan      |
| clipfrac           | 0.0      |
| explained_variance | 8.29e-06 |
| fps                | 15       |
| n_updates          | 30       |
| policy_entropy     | nan      |
| policy_loss        | nan      |
| serial_timesteps   | 61440    |
| total_timesteps    | 245760   |
| value_loss         | nan      |
---------------------------------
"""


def test_1_stable_baselines_table_is_one_record_with_its_n_updates_step(tmp_path, capsys):
    """Round 6: "no non-finite value and no error found"."""
    doc, out = _doctor(tmp_path, capsys, _SB2)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["step_from"], first["metric"], first["model"]) == (
        14,
        30,
        "the table's n_updates row",
        "approxkl",
        "policy",
    )
    assert first["values"] == [["approxkl", "nan"], ["policy_entropy", "nan"], ["policy_loss", "nan"],
                               ["value_loss", "nan"]]  # fmt: skip
    assert (
        "The first non-finite metric: approxkl (the policy) at step 30 (line 14), with " in out
        and "What it points to: the policy "
        "(approxkl, policy_entropy, policy_loss) and the value function (value_loss) of the same update (one "
        "iteration's dump, its rows sorted by key: their order does not say which went first)"
        in out
    )


# stable-baselines3 PPO: `time/iterations` (stable_baselines3/common/on_policy_algorithm.py:289) and `train/n_updates`
# (ppo/ppo.py:297), written under their tags' rows with the keys indented by three spaces (DLR-RM/stable-baselines3
# e05d2dbe stable_baselines3/common/logger.py:203-208, :227-233)
_SB3 = """-----------------------------------------
| rollout/                |             |
|    ep_len_mean          | 261         |
|    ep_rew_mean          | 1.53        |
| time/                   |             |
|    fps                  | 67          |
|    iterations           | 7           |
|    time_elapsed         | 60          |
|    total_timesteps      | 14336       |
| train/                  |             |
|    approx_kl            | 0.008046303 |
|    entropy_loss         | -1.38       |
|    loss                 | -0.00948    |
|    n_updates            | 60          |
|    policy_gradient_loss | -0.00737    |
|    value_loss           | nan         |
-----------------------------------------
"""


def test_1_sb3_tagged_keys_and_a_value_loss_alone_are_the_critic(tmp_path, capsys):
    """Round 6: no metric line read."""
    doc, out = _doctor(tmp_path, capsys, _SB3)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["step_from"], first["metric"], first["model"]) == (
        16,
        60,
        "the table's train/n_updates row",
        "train/value_loss",
        "critic",
    )
    assert (
        "What it points to: the value function (the critic): train/value_loss non-finite while the policy's values "
        "are finite" in out
    )


# openai/baselines ACKTR (baselines/acktr: logger.log("kl just right!"), logger.record_tabular("KL", kl),
# logger.dump_tabular()), the loop's own `Iteration N` line before each dump (openai/baselines#127), the table
# written by baselines/logger.py HumanOutputFormat.writekvs (openai/baselines ea25b9e :37-63)
_ACKTR = """Iteration 3026
kl too low

| EVAfter   | 0.984       |
| EVBefore  | 0.98        |
| EpRewMean | -7.31       |
| KL        | 0.000913428 |

Iteration 3027
kl just right!

| EVAfter   | 0.98     |
| EVBefore  | 0.976    |
| EpRewMean | -8.92    |
| KL        | nan      |
"""


def test_1_baselines_acktr_table_takes_the_iteration_line_before_it(tmp_path, capsys):
    """Round 6: "The log has no error line and no metric line"."""
    doc, out = _doctor(tmp_path, capsys, _ACKTR)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["metric"], first["model"]) == (15, 3027, "KL", "policy")
    assert first["step_from"] == "the line before the table, line 9: Iteration 3027"
    assert (
        "What it points to: the policy's update: KL non-finite while the value function's EVAfter, EVBefore in the "
        "same table are finite" in out
    )


def test_1_logger_table_readers_are_linear_on_a_100kb_line():
    line = "Iteration" + " " * 100_000
    started = time.process_time()
    assert logger_tables._ITERATION.match(line[:200]) is None
    assert logger_tables.row("|" + " " * 100_000 + "|") is None
    assert logger_tables.row("| " + "a" * 100_000 + " | nan |") is None  # past a row's length
    assert time.process_time() - started < 5


# 3. a CUDA assert's rank: the `[rankN]:` traceback right after its unprefixed line (modelscope/ms-swift#8378)
_SWIFT = (
    "Train:   7%|▋         | 82/1218 [18:06:05<227:39:40, 721.46s/it]\n"
    "Train:   7%|▋         | 82/1218 [18:06:05<227:39:40, 721.46s/it]/pytorch/aten/src/ATen/native/cuda/"
    "TensorCompare.cu:112: _assert_async_cuda_kernel: block: [0,0,0], thread: [0,0,0] Assertion `probability tensor "
    "contains either `inf`, `nan` or element < 0` failed.\n"
    "[rank5]: Traceback (most recent call last):\n"
    '[rank5]:   File "/env/ms-swift/swift/cli/rlhf.py", line 7, in <module>\n'
    "[rank5]:     rlhf_main()\n"
)


def test_3_cuda_assert_rank_from_the_traceback_after_it_and_step_from_its_bar(tmp_path, capsys):
    """Round 6: the failure named no rank and no step (the summary's rank came from the prefixes alone)."""
    doc, out = _doctor(tmp_path, capsys, _SWIFT)
    failure = doc["failure"]
    assert (failure["check"], failure["line"], failure["rank"], failure["step"]) == ("probability-assert", 2, 5, 83)
    assert (
        "On rank 5, sampling (torch.multinomial) was given probabilities holding inf, NaN or a negative value at step "
        "83 (printed after the progress bar's 82/1218: the next step)" in out
    )


# 4. a Python warning: warnings.formatwarning's `{file}:{line}: {category}: {message}` (nnaisense/MAX#1:
# imagination.py's warnings.warn("NaN in sampled next states!"))
_WARNING = (
    "11:01:08 | INFO | act | \tep: 63\taverage step return: 41819492609799.95\n"
    "/data/git/max/imagination.py:49: UserWarning: NaN in sampled next states!\n"
    '  warnings.warn("NaN in sampled next states!")\n'
)


def test_4_python_warning_naming_nan_is_a_message_not_a_metric(tmp_path, capsys):
    """Round 6: the metric `UserWarning`."""
    doc, out = _doctor(tmp_path, capsys, _WARNING)
    assert doc["summary"]["metric"] is None and doc["failure"]["check"] == "nonfinite-message"
    assert doc["failure"]["line"] == 2 and doc["failure"]["kind"] == "NaN"
    assert (
        "(line 2; UserWarning; a UserWarning at imagination.py:49 (/data/git/max/imagination.py) says: NaN in sampled "
        "next states!)" in out
    )


def test_4_warning_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert error_words.python_warning("a" * 100_000 + ".p:1: UserWarning: nan") is None
    assert error_words.python_warning("x.py:" * 20_000 + "Warning: nan") is None
    assert time.process_time() - started < 5


# 5. torch.distributions' argument validation (torch 2.13 torch/distributions/distribution.py:75-82), the value
# printed after it (IDSIA/hhmarl_2D#15, RLlib's torch policy)
_DISTRIBUTION = (
    "ValueError: Expected parameter logits (Tensor of shape (280, 13)) of distribution Categorical(logits: "
    "torch.Size([280, 13])) to satisfy the constraint IndependentConstraint(Real(), 1), but found invalid values:\n"
    "tensor([[nan, nan, nan,  ..., nan, nan, nan],\n"
    "        [nan, nan, nan,  ..., nan, nan, nan]], grad_fn=<SubBackward0>)\n"
)


def test_5_distribution_validation_error_names_the_distribution_and_its_parameter(tmp_path, capsys):
    """Round 6: only the unnamed printed tensor after it was seen."""
    doc, out = _doctor(tmp_path, capsys, _DISTRIBUTION)
    failure = doc["failure"]
    assert (failure["check"], failure["line"], failure["kind"], failure["op"]) == (
        "nonfinite-error",
        1,
        "NaN",
        "ValueError",
    )
    assert doc["summary"]["metric"] == "logits"
    assert (
        "torch.distributions: Categorical's parameter logits (Tensor of shape (280, 13)) failed its constraint "
        "IndependentConstraint(Real(), 1): NaN (Real() fails on NaN alone); the logits the policy computed are "
        "invalid" in out
    )


def test_5_distribution_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    line = "Expected parameter logits (Tensor of shape (" + "1, " * 33_000 + ")) but found invalid values"
    assert error_words.distribution(line) is None
    assert time.process_time() - started < 5


# 6. a named printed tensor: Megatron-DeepSpeed's pipeline p2p buffer printed by a debugging print
# (deepspeedai/Megatron-DeepSpeed#203); tensor_recv_next is what recv_backward receives from the next stage
# (megatron-core 0.15.0rc0 pipeline_parallel/p2p_communication.py:434-450)
_P2P = (
    " tensor_recv_next: tensor([[[        inf,         inf,         inf,  ...,  4.1954e+36,\n"
    "                 -inf,        -inf]]], device='cuda:0', dtype=torch.bfloat16)\n"
)


def test_6_named_printed_tensor_is_named(tmp_path, capsys):
    """Round 6: "no non-finite value" (a tensor after a name was left to the metric lines, which did not read it)."""
    doc, out = _doctor(tmp_path, capsys, _P2P)
    assert (doc["failure"]["check"], doc["failure"]["line"], doc["failure"]["kind"]) == ("printed-tensor", 1, "Inf")
    assert (
        "tensor_recv_next: its values inf, inf, inf, ..., 4.1954e+36,; the pipeline stage received it from the next "
        "stage (in the backward: the gradient of its output): a later stage went non-finite first" in out
    )


def test_6_named_tensor_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert error_words.named_tensor("a" * 100_000 + ": tensor([" + "1, " * 30_000) is None
    assert error_words.named_tensor("x: tensor([" * 10_000) is None
    assert time.process_time() - started < 5


# 8. an error's keys as written (TimZaman/dotaclient#42: optimizer.py's own check raises with its four losses)
_DOTA = (
    "Traceback (most recent call last):\n"
    '  File "optimizer.py", line 646, in train\n'
    "    loss, policy_loss, entropy_loss, advantage_loss))\n"
    "ValueError: loss=nan, policy_loss=nan, entropy_loss=nan, advantage_loss=nan\n"
)


def test_8_error_line_names_its_first_key_as_written(tmp_path, capsys):
    """Round 6: "Its entropy left its range" (the range scan's `entropy` key read `entropy_loss`)."""
    doc, out = _doctor(tmp_path, capsys, _DOTA)
    # round 10 named the total's first term; round 28: the total, with its terms (test_doctor_classes10 4)
    assert doc["failure"]["check"] == "nonfinite-error" and doc["summary"]["metric"] == "loss"
    assert doc["summary"]["also"] == ["policy_loss", "entropy_loss", "advantage_loss"]
    assert "entropy left its range" not in out and "Its entropy" not in out
    assert "The first non-finite metric: loss (the policy) (the line names no step) (line 4), with policy_loss, " in out


def test_8_key_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert error_words.first_key("a" * 100_000 + "=1") is None
    assert error_words.first_key("a=" * 50_000) is None
    assert time.process_time() - started < 5


# 2. steps: mmcv's TextLoggerHook (mmcv v1.7.2 mmcv/runner/hooks/logger/text.py:137-143: `Iter [{iter}/{max_iters}]`
# by iteration, `Epoch [{epoch}][{iter}/{len}]` by epoch), here mmsegmentation's (rayguan97/GANav-offroad#14)
_MMCV_ITER = "".join(
    f"2022-07-26 11:14:{i:02d},372 - mmseg - INFO - Iter [{it}/160000]\tlr: 9.994e-03, eta: 8:49:53, time: 0.145, "
    f"data_time: 0.001, memory: 17373, decode.loss_seg: {loss}, decode.acc_seg: 23.8205, loss: {loss}\n"
    for i, (it, loss) in enumerate(((50, "0.8123"), (100, "nan"), (150, "nan")))
)


def test_2_mmcv_iter_names_the_step(tmp_path, capsys):
    """Round 6: "the line names no step"."""
    doc, out = _doctor(tmp_path, capsys, _MMCV_ITER)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["step_from"], first["metric"]) == (
        2,
        100,
        "the line",
        "decode.loss_seg",
    )
    assert "The first non-finite metric: decode.loss_seg at step 100 (line 2), with " in out


# a loop's own progress line before its error: TimZaman/dotaclient (8615b90) optimizer.py:438 logs `iteration
# {it}/{iterations}` at the start of each iteration, the PPO epochs inside it, and raises at :668 (dotaclient#42)
_DOTA_LOOP = (
    "2019-02-15 15:37:57,825 INFO     steps_per_s=25.76, avg_weight_age=1.0, loss=-0.1758, entropy=5.023\n"
    "2019-02-15 15:37:57,878 INFO     iteration 27/10000\n"
    "2019-02-15 15:40:09,232 INFO      epoch 1/4\n"
    "2019-02-15 15:40:12,433 INFO      epoch 2/4\n" + _DOTA
)


def test_2_the_loops_iteration_line_before_an_error_gives_its_step(tmp_path, capsys):
    """Round 6: no step."""
    doc, out = _doctor(tmp_path, capsys, _DOTA_LOOP)
    failure = doc["failure"]
    assert (failure["line"], failure["step"]) == (8, 27)
    assert doc["summary"]["step"] == 27
    assert (
        "The run ended on an error naming NaN or Inf at step 27 (the loop's progress line 6 line(s) before it, line 2: "
        "'2019-02-15 15:37:57,878 INFO iteration 27/10000': at or after step 27)" in out
    )


def test_2_loop_line_reader_is_linear_on_a_100kb_line():
    started = time.process_time()
    assert loop_lines.progress("iteration " * 10_000 + "x") is None
    assert loop_lines.progress("step" + " " * 100_000 + "1/") is None
    assert time.process_time() - started < 5


# danijar/dreamer's `print(f'[{step}]', ' / '.join(f'{k} {v:.1f}' for k, v in metrics))` (dreamer.py, Dreamer._write_summaries;
# danijar/dreamer#58)
_DREAMER = (
    "[4000] expl_amount 0.0 / model_grad_norm 812.3 / value_grad_norm 40.3 / image_loss 11650.7\n"
    "[5000] expl_amount 0.0 / model_grad_norm nan / value_grad_norm 40.3 / image_loss 11650.7\n"
)


def test_2_dreamer_bracketed_step_at_the_line_head(tmp_path, capsys):
    """Round 6: "the line names no step"."""
    doc, out = _doctor(tmp_path, capsys, _DREAMER)
    assert (doc["summary"]["metric"], doc["summary"]["step"]) == ("model_grad_norm", 5000)


# 7. a Trainer dict's step from the bar redrawn after it: ProgressCallback.on_step_end updates the bar to global_step
# (transformers 4.57.6 trainer_callback.py:651-654) before the dict is logged (trainer.py:2753-2756), and on_log prints
# it with tqdm.write (:676-693), which redraws the bar after it; here a forked worker's warning glued to the bars
# (hiyouga/LlamaFactory#9298)
_FORK = "huggingface/tokenizers: The current process just got forked, after parallelism has already been used."
_TRAINER = (
    "{'loss': 3.5249, 'grad_norm': 100.6954116821289, 'learning_rate': 0.0, 'epoch': 1.0}\n"
    f"  0%|▋         | 1/300 [00:02<11:15,  2.26s/it]{_FORK}\n"
    "To disable this warning, you can either:\n"
    "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 3.333333333333333e-10, 'epoch': 2.0}\n"
    f"  1%|█▎        | 2/300 [00:03<09:24,  1.89s/it]{_FORK}\n"
)


def test_7_trainer_dict_takes_the_one_bar_redrawn_after_it(tmp_path, capsys):
    """Round 6: step 1, from the bar before the dict."""
    doc, out = _doctor(tmp_path, capsys, _TRAINER)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"], first["metric"]) == (4, 2, "grad_norm")
    assert first["step_from"].startswith("the progress bar redrawn after it, 2/300 (the Trainer updates its bar")
