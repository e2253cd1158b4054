"""Issue 41, round 23: the classes of holdout23 (reports doctor had never read) that live in the metric lines and
printed values, on crafted input of each class. Each positive test fails on main e40e49b (the loss scaler's classes:
test_doctor_classes23_scales.py; the tracebacks': test_doctor_classes23_frames.py)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. NumPy's repr of an array holding NaN, in a list a loop printed (`Losses: [array([...], dtype=float32), ...]`,
# holdout23 14): a printed value, not "no non-finite value"
def test_1_a_numpy_array_holding_nan_is_a_printed_value(tmp_path, capsys):
    log = (
        "Losses: [array([-0.0111, 0.0113, 1.6872], dtype=float32), array([-0.0131, 0.0083, 1.4614], dtype=float32), "
        "array([nan, nan, nan], dtype=float32), array([nan, nan, nan], dtype=float32)]\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["kind"] == "NaN"
    assert "its values nan, nan, nan (a NumPy array)" in out
    assert "no non-finite value" not in out


def test_1_a_finite_array_is_no_evidence(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "weights: [array([0.5, 1.25], dtype=float32)] at epoch 3 of inference\n")
    assert "NumPy array" not in out


# 2. a record printed a key per line under a banner naming its counter (pat-coady/trpo's `***** Episode 31455,
# Mean R = ... *****`, PPO-for-Beginners' `---- Iteration #50 ----`: holdout23 13, 15): the banner's count is its step
@pytest.mark.parametrize(
    ("banner", "step", "unit"),
    [
        ("***** Episode 120, Mean R = -311.4 *****", 120, "episode"),
        ("-------------------- Iteration #50 --------------------", 50, "iteration"),
        ("===== step 3000 =====", 3000, "step"),
    ],
)
def test_2_a_record_banner_names_its_step(tmp_path, capsys, banner, step, unit):
    log = f"{banner}\nBeta: 1.5\nExplainedVarNew: 0.91\nKL: nan\nPolicyEntropy: nan\nValFuncLoss: 114\n"
    doc, out = _doctor(tmp_path, capsys, log)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["metric"], first["step"]) == ("KL", step)
    assert first["step_from"] == f"the record's banner, line 1: `{banner}`, its {unit} count"


def test_2_an_epoch_banner_is_no_step(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "======== Epoch 3 / 10 ========\nloss: nan\naccuracy: 0.1\n")
    assert doc["metrics"]["first_nonfinite"]["step"] is None


# 3. an evaluation line first, then the training line of the same step, both non-finite (mlx_lm's GRPO prints `Iter
# 10: Val loss nan, ...` before `Iter 10: Train loss nan, ...`: holdout23 10): the weights, not the evaluation alone
# (round 29: where the training line prints finite rewards, the loss's computation: test_doctor_classes29.py, 13)
def test_3_a_training_loss_of_the_same_step_is_not_the_evaluation_only(tmp_path, capsys):
    log = (
        "Iter 10: Val loss nan, Val total_rewards_mean 0.000, Val kl nan, Val took 2.1s\n"
        "Iter 10: Train loss nan, KL nan, Learning Rate 1.000e-05, It/sec 0.2\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["first_nonfinite"]["metric"] == "Val loss"
    assert doc["summary"]["points_to"] == (
        "the weights, not the evaluation alone: the training loss reported at step 10 is non-finite too (line 2): weights "
        "already non-finite make both losses so"
    )


def test_3_an_evaluation_alone_is_still_said(tmp_path, capsys):
    log = (
        "Iter 10: Val loss nan, Val kl nan, Val took 2.1s\n"
        "Iter 10: Train loss 0.512, Total rewards mean 1.406, KL 0.001, It/sec 0.2\n"
    )
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["points_to"].startswith("the evaluation only: a loss on held-out data")


# 4. each process logs its own metric line, its rank at the end (CosyVoice's trainer: `... grad_norm nan rank 2`,
# holdout23 01): the ranks that logged the first non-finite step, in the order logged
def test_4_the_ranks_each_line_names_are_said(tmp_path, capsys):
    line = "2025-02-20 00:46:13,777 DEBUG TRAIN Batch 7/100 loss nan lr 0.00055784 grad_norm nan rank {}\n"
    doc, out = _doctor(tmp_path, capsys, "".join(line.format(rank) for rank in (2, 3, 0, 1)))
    assert doc["metrics"]["first_nonfinite"]["ranks"] == [2, 3, 0, 1]
    assert "logged by rank 2, and at the same step by rank(s) 3, 0, 1 (each line names its rank)" in out
    assert doc["summary"]["rank"] is None  # every rank logged it: none is the failing one


def test_4_another_step_s_rank_is_not_added(tmp_path, capsys):
    log = (
        "DEBUG TRAIN Batch 7/100 loss nan lr 0.00055784 grad_norm nan rank 2\n"
        "DEBUG TRAIN Batch 8/100 loss nan lr 0.00055784 grad_norm nan rank 3\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["first_nonfinite"]["ranks"] == [2]
    assert "logged by rank 2 (its line names it)" in out


# 5. a name of several words alone on its line, unindented (PPO-for-Beginners' `Average Episodic Return: nan` under
# its banner, holdout23 15): the whole name, not its last word
def test_5_a_name_of_words_alone_on_its_line_is_the_key(tmp_path, capsys):
    log = "---- Iteration #50 ----\nAverage Episodic Length: 1.0\nAverage Episodic Return: nan\nAverage Loss: nan\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["first_nonfinite"]["metric"] == "Average Episodic Return"


def test_5_a_sentence_s_words_are_no_name(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "step 3\nthe loss is: nan\n")
    assert doc["metrics"]["first_nonfinite"] is None or doc["metrics"]["first_nonfinite"]["metric"] != "the loss is"


# 6. Megatron's iteration lines whose loss scale falls while their own skip counter stays 0 (BigScience's
# Megatron-DeepSpeed, holdout23 07): Megatron-LM counts each step its scaler skips, so the scaler is DeepSpeed's engine
def _iteration(step: int, scale: float, skipped: int) -> str:
    return (f" iteration {step:8d}/  311541 | consumed samples: {step * 8:12d} | elapsed time per iteration (ms): "
            f"22306.6 | learning rate: 9.850E-05 | global batch size:  1024 | lm loss: 2.775923E+00 | loss scale: "
            f"{scale:.1f} | grad norm: 0.000 | num zeros: 0.0 | number of skipped iterations: {skipped:3d} | number "
            "of nan iterations:   0 |\n")  # fmt: skip


def test_6_a_scale_falling_beside_a_zero_skip_counter_is_megatron_deepspeed(tmp_path, capsys):
    lines = _iteration(29020, 65536.0, 0) + _iteration(29030, 65536.0, 0) + _iteration(29040, 8192.0, 0)
    doc, out = _doctor(tmp_path, capsys, lines)
    assert doc["framework"]["name"] == "megatron-deepspeed"
    assert "the scaler is not Megatron-LM's (DeepSpeed's engine, as Megatron-DeepSpeed runs it)" in out


def test_6_a_scale_falling_with_its_skips_counted_is_megatron_lm(tmp_path, capsys):
    lines = _iteration(29020, 65536.0, 0) + _iteration(29030, 65536.0, 0) + _iteration(29040, 8192.0, 3)
    doc, _ = _doctor(tmp_path, capsys, lines)
    assert doc["framework"]["name"] == "megatron-lm"
