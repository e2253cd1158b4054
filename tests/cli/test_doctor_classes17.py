"""Issue 41, round 17: the classes holdout17 (25 reports doctor had never read, graded on main 6170906) read partly or
wrong, each on crafted input of its class. Each test fails on round 16's doctor (main 6170906)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. ZeRO stage 2's overflow line printed by every rank (THUDM/GLM#32): not rank 0's for all; round 28: each rank's
# print of an all-reduced flag, not that rank's own overflow (DeepSpeed v0.3.13 zero/stage2.py:1387-1391, :1561)
def test_1_an_overflow_line_naming_another_rank_is_that_rank_s_print(tmp_path, capsys):
    stamp = "[2022-09-14 22:58:01,089] [INFO] [stage2.py:1387:step] [deepspeed] fp16 dynamic loss scale overflow! "
    log = "".join(f"{stamp}Rank {r} Skipping step. Attempted loss scale: 536870912.0, reducing to 268435456.0\n"
                  for r in (6, 4))  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["failure"]["other_ranks"] == ["rank 6 logs it (ZeRO stage 2 prints this line on every rank once the "
                                       "overflow flag is all-reduced: an overflow on any rank, not rank 6's own)"]  # fmt: skip
    assert "DeepSpeed prints it on rank 0 only" not in out


def test_1_stage_2_s_line_on_rank_0_is_every_rank_s_too(tmp_path, capsys):
    log = ("[INFO] [stage2.py:1387:step] [deepspeed] fp16 dynamic loss scale overflow! Rank 0 Skipping step. Attempted "
           "loss scale: 65536.0, reducing to 32768.0\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["failure"]["other_ranks"] == ["rank 0 logs it (ZeRO stage 2 prints this line on every rank once the "
                                       "overflow flag is all-reduced: an overflow on any rank, not rank 0's own)"]  # fmt: skip


def test_1_loss_scaler_s_line_is_rank_0_s_for_all(tmp_path, capsys):
    log = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["failure"]["other_ranks"] == ["rank 0 logs it (DeepSpeed prints it on rank 0 only)"]


# 2. Python's json refusing a NaN or Inf (THUDM/slime#1790: SGLang's rollout server answered 503)
@pytest.mark.parametrize(("tail", "kind"), [("", "NaN or Inf"), (": nan", "NaN"), (": -inf", "Inf")])
def test_2_a_json_encoder_refusing_a_non_finite_float_is_the_error(tmp_path, capsys, tail, kind):
    log = f"ValueError: Out of range float values are not JSON compliant{tail}\n Error: Server error '503 Service\n"
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["failure"]["check"], doc["failure"]["op"], doc["failure"]["kind"]) == (
        "nonfinite-error", "json (allow_nan=False)", kind)  # fmt: skip
    assert "a JSON encoder refused a NaN or Inf float" in out and "Not a NaN failure" not in out


# 3. fairseq by its metric lines' keys (facebookresearch/fairseq#512, #515)
def test_3_fairseq_s_metric_lines_name_it(tmp_path, capsys):
    log = ("| epoch 001:    200 / 1374 loss=14.351, ppl=20899.56, wps=49604, ups=0, wpb=277035.016, bsz=8563.074, "
           "num_updates=190, lr=4.8e-06, gnorm=3.901, clip=0.000, oom=0.000, loss_scale=0.062\n"
           "| WARNING: overflow detected, setting loss scale to: 0.03125\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "fairseq"


# 4. a loss scale printed as 0.000 (facebookresearch/fairseq#1529): no NaN printed, and still a collapse
def test_4_a_printed_loss_scale_below_2_to_the_minus_10_is_a_collapse(tmp_path, capsys):
    log = ("| epoch 028 | loss 3.976 | nll_loss 2.204 | ppl 4.61 | wps 279460 | ups 3 | wpb 110529.673 | bsz 3780.211 | "
           "num_updates 9165 | lr 0.00033 | gnorm 0.635 | clip 0.000 | oom 0.000 | loss_scale 0.000 | wall 4043\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["loss_scale_collapsed"] == {"scale": 0.0, "line": 1, "step": 9165}
    assert (
        "The loss scale its metric lines print is 0 at line 1 (step 9165): below 2^-10, a dynamic loss scaler "
        "halved it on overflow after overflow"
    ) in out
    assert "Not a NaN failure" not in out


@pytest.mark.parametrize("value", ["0", "0.0"])
def test_4_a_config_s_dynamic_loss_scale_0_is_no_collapse(tmp_path, capsys, value):
    log = f'Grad overflow on iteration: 445299\n{{\n    "fp16": {{\n        "loss_scale": {value},\n        "hysteresis": 2\n'
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["loss_scale_collapsed"] is None


def test_4_a_collapse_after_a_fall_is_said_with_the_fall(tmp_path, capsys):
    log = "".join(f"| epoch 00{i} | loss 6.0 | wpb 3000 | bsz 100 | num_updates {i}00 | loss_scale {scale} | wall 20\n"
                  for i, scale in ((1, "16.000"), (2, "8.000"), (3, "0.500"), (4, "0.000")))  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["loss_scale_collapsed"] == {"scale": 0.0, "line": 4, "step": 400}
    assert (
        "The loss scale its metric lines print is 0 at line 4 (step 400) (it fell from 16 at line 1 (step 100)): "
        "below 2^-10"
    ) in out
    assert "calibrating" not in out


# 5. torch.distributions' validation error wrapped before `but found invalid values` (voidful/TextRL#21)
def test_5_a_wrapped_distribution_validation_error_is_read(tmp_path, capsys):
    log = ("ValueError: Expected parameter logits (Tensor of shape (2, 2, 50257)) of distribution Categorical(logits: \n"
           "torch.Size([2, 2, 50257])) to satisfy the constraint IndependentConstraint(Real(), 1), but found invalid "
           "values:\ntensor([[[nan, nan, nan,  ..., nan, nan, nan]]], device='cuda:0')\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["failure"]["check"], doc["summary"]["metric"]) == ("nonfinite-error", "logits")
    assert "Categorical's parameter logits (Tensor of shape (2, 2, 50257)) failed its constraint" in out


# 6. Lightning's bar counts within its epoch, from 0 (ssbuild/chatglm_finetuning#104)
def test_6_lightning_s_epoch_bar_gives_the_global_step(tmp_path, capsys):
    log = "Epoch 1:   1%|          | 23/4360 [00:32<1:43:33,  1.43s/it, loss=nan, v_num=0]\n"
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["step"] == 4383
    assert (
        "Lightning's bar counts the batches of epoch 1, its description, counted from 0: 1 x 4360 + 23, where each "
        "epoch's bar is as long"
    ) in out


# 7. `step` beside `global_step` (liucongg/ChatGLM-Finetuning#132): the optimizer's count is the step
def test_7_global_step_is_the_step_beside_another_count(tmp_path, capsys):
    log = "Epoch: 0, step: 4, global_step:1, loss: nan\n"
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["step"] == 1
    assert "step 1 (the line's global_step (its step 4 counts something else))" in out
