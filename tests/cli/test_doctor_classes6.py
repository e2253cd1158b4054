"""Issue 41, round 6: the classes of misreading found on a sixth set of real reports doctor had never read, each on
crafted input of its class in the stack's own format: steps written a stack's own way (Marian's `Up.`, `[step] N`, a
bare `[N]`, rsl-rl's `Learning iteration` block, whose value function loss is the critic's) (a), a MetricLogger meter's
running average gone non-finite (b), bare `step value` lines of a counter (c), a sampler's `Bad probs detected` guard
(d), a framework named from keys any loop prints (e), DeepSpeed-Chat's steps beside DeepSpeed's own count and a scale
falling on every step mid-run (f), a step from a bar of one epoch and fairseq's `num_updates` (g). A CUDA
out-of-memory error after NaN in TRL (h) already reads (exit 0) on round 5's doctor: no test here. Each test of a
class fails on round 5's doctor; the negative ones (what is not read) and the linear-time checks guard the new
readers."""

import time

import pytest

from nanscope.launch import line_shapes, logs
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _first(doc: dict) -> tuple:
    first = doc["metrics"]["first_nonfinite"]
    return first["line"], first["metric"], first["step"], first["model"]


# a. steps a stack writes its own way

# Marian's Scheduler (marian-nmt/marian src/training/scheduler.h:452 at 65bf82ff): `Ep. {} : Up. {} : Sen. {} : {} :
# Time {:.2f}s : {:.2f} words/s : gNorm {:.4f} : L.r. {:.4e}`, the cost printed `Cost nan`; `Up.` counts updates
_MARIAN = "".join(
    f"[2020-05-04 10:1{i}:00] Ep. 1 : Up. {up} : Sen. {sen} : Cost {cost} : Time 60.00s : 12000.00 words/s : "
    f"gNorm {norm} : L.r. 3.0000e-04\n"
    for i, (up, sen, cost, norm) in enumerate(((200, "51,200", "3.45", "1.2345"), (300, "76,800", "nan", "nan")))
)
# a bracketed step field and bracketed names (lion-pytorch-like example scripts: `[step] 104 [Loss] nan`)
_BRACKETS = "".join(f"[step] {step} [Loss] {loss} [LR] 0.0001\n" for step, loss in ((103, "2.3451"), (104, "nan")))
# DreamerV3-like: the step bare in brackets at the line's head, then `name value` fields separated by `/`
_BARE = "".join(
    f"[{step}] model_loss {loss} / actor_loss 0.51 / critic_loss 1.20 / fps 100.0\n"
    for step, loss in ((4000, "12.3"), (5000, "nan"))
)


def _rsl_block(iteration: int, value: str, surrogate: str, pad: int = 35, width: int = 80) -> str:
    """rsl-rl's OnPolicyRunner.log (leggedrobotics/rsl_rl rsl_rl/runners/on_policy_runner.py:178-188 at ff9e971):
    a `#` rule, the bold `Learning iteration {it}/{total}` header centred, then right-aligned `Name: value` lines."""
    header = f" \033[1m Learning iteration {iteration}/1500 \033[0m "
    return (
        f"{'#' * width}\n{header.center(width, ' ')}\n\n"
        f"{'Computation:':>{pad}} 51234 steps/s (collection: 1.234s, learning 0.456s)\n"
        f"{'Value function loss:':>{pad}} {value}\n{'Surrogate loss:':>{pad}} {surrogate}\n"
        f"{'Mean action noise std:':>{pad}} 0.85\n{'Mean reward:':>{pad}} 12.34\n"
        f"{'Mean episode length:':>{pad}} 500.00\n"
    )


_RSL = _rsl_block(120, "0.0123", "-0.0051") + _rsl_block(121, "inf", "nan") + _rsl_block(122, "nan", "nan")


def test_a_marian_up_is_the_step(tmp_path, capsys):
    """Round 5: "Cost (the line names no step)"."""
    doc, out = _doctor(tmp_path, capsys, _MARIAN)
    assert _first(doc) == (2, "Cost", 300, None)
    assert doc["metrics"]["first_nonfinite"]["step_from"] == "the line (Marian's `Up.`: the update count)"
    assert (
        "The first non-finite metric: Cost at step 300 (line 2), with " in out
        and "What it points to: the forward pass or the loss itself: the loss is non-finite." in out
    )


def test_a_a_bracketed_step_field_and_names(tmp_path, capsys):
    """Round 5: metric `Loss]`, no step."""
    doc, out = _doctor(tmp_path, capsys, _BRACKETS)
    assert _first(doc) == (2, "Loss", 104, None)
    assert "The first non-finite metric: Loss at step 104 (line 2)." in out


def test_a_a_bare_bracketed_step_at_the_head(tmp_path, capsys):
    """Round 5: "model_loss (the line names no step)"."""
    doc, out = _doctor(tmp_path, capsys, _BARE)
    assert _first(doc) == (2, "model_loss", 5000, None)
    assert "The first non-finite metric: model_loss at step 5000 (line 2)." in out


def test_a_rsl_rl_value_function_loss_is_the_critic_s_at_its_iteration(tmp_path, capsys):
    """Round 5: metric `loss`, no step, no model. Round 29: the block is one record, so a NaN surrogate loss in it
    leaves no one model (launch.blocks)."""
    doc, out = _doctor(tmp_path, capsys, _RSL)
    assert _first(doc) == (14, "Value function loss", 121, None)
    assert doc["metrics"]["first_nonfinite"]["step_from"] == (
        "the block it is in (line 11: `Learning iteration 121/...`)"
    )
    assert (
        "The first non-finite metric: Value function loss at step 121 (line 14), with Surrogate loss non-finite in the "
        "same record too (which went first the record does not say). What it points to: the actor's and the "
        "critic's losses at once: an input they share" in out
    )
    alone = _rsl_block(120, "0.0123", "-0.0051") + _rsl_block(121, "inf", "-0.0052")
    doc, out = _doctor(tmp_path, capsys, alone)
    assert _first(doc) == (14, "Value function loss", 121, "critic")
    assert (
        "The first non-finite metric: Value function loss (the critic, the value model) at step 121 (line 14). What it "
        "points to: the critic (the value model): its value loss went non-finite first in the block's order (its line "
        "holds no actor metric)" in out
    )


def _rsl_logger_block(iteration: int, value: str) -> str:
    """rsl-rl's Logger today (rsl_rl/utils/logger.py:237, :253 at c281c32): `Mean {key} loss:` for each of PPO's
    losses (rsl_rl/algorithms/ppo.py:332-333: `value`, `surrogate`)."""
    header = f" Learning iteration {iteration}/1500 "
    return (
        f"{'#' * 80}\n\033[1m{header.center(80)}\033[0m \n\n{'Total steps:':>35} 98304 \n"
        f"{'Mean value loss:':>35} {value}\n{'Mean surrogate loss:':>35} {value}\n"
    )


def test_a_rsl_rl_s_logger_names_the_critic_s_mean_value_loss(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _rsl_logger_block(5, "0.0100") + _rsl_logger_block(6, "nan"))
    assert _first(doc) == (11, "Mean value loss", 6, None)  # round 29: its surrogate loss is NaN in the same block
    assert doc["summary"]["also"] == ["Mean surrogate loss"]


def test_a_a_bracketed_date_is_no_step():
    assert line_shapes.named_step("[2020-05-04 10:11:00] loss nan / acc 0.5") is None
    assert line_shapes.named_step("[rank0] loss nan") is None


# b. MetricLogger's `median (global_avg)`: the running average non-finite

# facebookresearch/deit utils.py:33 (SmoothedValue's fmt `{median:.4f} ({global_avg:.4f})`), :146-166 (log_every:
# `header  [i/N]  eta: ...  {meters}  time: ...`); timm, BEiT and VideoMAE print the same
_AVERAGED = "".join(
    f"Epoch: [3]  [{i:>4}/1251]  eta: 0:10:00  lr: 0.000500  loss: {loss} ({loss_avg})  grad_norm: 0.3900 "
    f"({norm_avg})  time: 0.5000  data: 0.0100  max mem: 12000\n"
    for i, loss, loss_avg, norm_avg in ((100, "2.1500", "2.1620", "0.4100"), (110, "2.1100", "nan", "nan"))
)


def test_b_a_running_average_gone_nan_is_evidence(tmp_path, capsys):
    """Round 5: "no non-finite value and no error found in 2 lines", benign."""
    doc, out = _doctor(tmp_path, capsys, _AVERAGED)
    assert _first(doc) == (2, "loss (running average)", 110, None)
    assert doc["metrics"]["first_nonfinite"]["values"] == [
        ["loss (running average)", "nan"],
        ["grad_norm (running average)", "nan"],
    ]
    assert doc["summary"]["benign"] is None
    assert (
        "What it points to: the running average of loss since the start is non-finite (the logger's `median "
        "(global_avg)`): a value went NaN or Inf at this iteration or at an earlier one it did not print, and the sum "
        "it averages stays so." in out
    )


# c. bare `step value` lines: yanmtt's pretrain_nmt.py:281 (prajdabre/yanmtt at 8a91fdf), `print(ctr, lv)` every 10
# batches on rank 0

_COUNTER = "Reloading ctr. This means we resume training.\n" + "".join(
    f"{step} {loss}\n" for step, loss in ((76950, "3.3012"), (76960, "3.252"), (76970, "3.2101"), (76980, "nan"))
)


def test_c_a_counter_column_gives_the_step(tmp_path, capsys):
    """Round 5: "no non-finite value and no error found in 5 lines", benign."""
    doc, out = _doctor(tmp_path, capsys, _COUNTER)
    assert _first(doc) == (5, "value", 76980, None)
    assert "The first non-finite metric: value at step 76980 (line 5)." in out


@pytest.mark.parametrize(
    "log",
    [
        "Shapes of the batches:\n1024 768\n3 5\n12 nan\n",  # no counter: numbers that do not rise by one stride
        "76970 3.2101\n76980 nan\n",  # one line before: no stride to continue
    ],
)
def test_c_arbitrary_number_pairs_are_not_read(log, tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["first_nonfinite"] is None


# d. a sampler's guard: `Bad probs detected: NaN: True, ...` (RLinf-like; the line as the round-6 report pasted it,
# its printing code not in the public code index): the probabilities are non-finite, no metric called `detected`

_BAD_PROBS = "Bad probs detected: NaN: True, Inf: False, Neg: False\n"


def test_d_bad_probs_are_the_sampling_probabilities(tmp_path, capsys):
    """Round 5: "The first non-finite metric: detected"."""
    doc, out = _doctor(tmp_path, capsys, _BAD_PROBS)
    assert (doc["failure"]["check"], doc["failure"]["fatal"], doc["summary"]["metric"]) == ("bad-probs", False, None)
    assert (
        "The sampler's guard found the sampling probabilities non-finite (the policy's logits at rollout) (line 1; "
        "sampling; NaN: True, Inf: False, Neg: False)." in out
    )
    assert "detected" not in out.split("the error (as the log printed it)")[0].replace("Bad probs detected", "")


def test_d_a_guard_that_found_nothing_is_no_evidence(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "Bad probs detected: NaN: False, Inf: False, Neg: True\nstep 3 loss 0.5\n")
    assert doc["failure"] is None or doc["failure"]["check"] != "bad-probs"


# e. no framework named from generic keys: rl-coach's Logger.log_dict (IntelLabs/coach rl_coach/logger.py:103-115,
# without colours: `{prefix}> k=v, k=v`) of clipped PPO's training (rl_coach/agents/clipped_ppo_agent.py:294-303) and of
# an episode (rl_coach/agents/agent.py:473-483): `loss`, `learning_rate` and `epoch` are any loop's keys

_COACH = (
    "2019-05-21-10:12:42.123456 Training> Name=main_level/agent, Worker=0, Episode=12, Total reward=-3.5, "
    "Exploration=0.1, Steps=2400, Training iteration=11\n"
    "2019-05-21-10:12:43.123456 Policy training> Surrogate loss=nan, KL divergence=nan, Entropy=nan, training "
    "epoch=0, learning_rate=0.0003\n"
)


def test_e_generic_keys_name_no_framework(tmp_path, capsys):
    """Round 5: "framework transformers (its metric lines' keys (epoch, learning_rate, loss))"."""
    doc, out = _doctor(tmp_path, capsys, _COACH)
    assert doc["framework"] == {
        "name": "unknown",
        "release": None,
        "how": "nothing in the input names a framework nanscope catalogues",
        "stack": None,
    }
    assert "transformers" not in out
    assert doc["metrics"]["first_nonfinite"]["line"] == 2


def test_e_a_trainer_dict_still_names_transformers(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}\n")
    assert doc["framework"]["name"] == "transformers"
    assert doc["framework"]["how"] == ("its metric lines' keys (epoch, learning_rate, loss), printed as a Python dict")


# f. DeepSpeed-Chat under DeepSpeed's FP16_Optimizer: the overflow lines count the optimizer's iterations (the actor's
# and the critic's engines each step: iteration 3721 at training step 1860), the metric lines the training steps.
# DeepSpeed's lines as deepspeedai/DeepSpeed#2069 pasted them (fused_optimizer.py:382-383 `_update_scale`, the message
# after a newline; logging.py:69 log_dist); DeepSpeed-Chat's line as deepspeedai/DeepSpeedExamples#444 pasted it
# (tests/fixtures/reports/real/deepspeed-chat-444.txt)


def _chat_step(minute: int, iteration: int, step: int, scale: int, loss: str) -> str:
    stamp = f"[2023-05-10 08:{minute:02d}:01,100] [INFO]"
    return (
        f"{stamp} [fused_optimizer.py:382:_update_scale] \nGrad overflow on iteration {iteration}\n"
        f"{stamp} [fused_optimizer.py:383:_update_scale] Reducing dynamic loss scale from {scale:.1f} to "
        f"{scale / 2:.1f}\n"
        f"{stamp} [logging.py:69:log_dist] [Rank 0] Overflow detected. Skipping step. Attempted loss scale: "
        f"{scale:.1f}, reducing to {scale / 2:.1f}\n"
        f"epoch: 0|step: {step}|ppo_ep: 1|act_loss: {loss}|cri_loss: {loss}|unsuper_loss: 0.0\n"
        "average reward score: -1.25\n"
    )


_CHAT = "".join(_chat_step(i, 3705 + 2 * i, 1852 + i, 2 ** (32 - i), "nan" if i == 8 else "0.0213") for i in range(9))


def test_f_deepspeed_chat_steps_are_the_training_steps_not_the_optimizer_s_count(tmp_path, capsys):
    """Round 5: "skipped a step on inf or NaN gradients at step 3705" beside act_loss at step 1860."""
    doc, out = _doctor(tmp_path, capsys, _CHAT)
    failure = doc["failure"]
    assert (failure["check"], failure["line"], failure["step"]) == ("deepspeed-overflow", 2, 1852)
    assert _first(doc) == (53, "act_loss", 1860, None)
    assert (
        "at step 1852 (the metric line after it, line 5 (the optimizer's own count is 3705: its iterations, not the "
        "training steps))" in out
    )


def test_f_a_scale_falling_on_every_step_mid_run_is_no_calibration(tmp_path, capsys):
    """Round 5: "18 overflow line(s), the loss scale from 4294967296 (2^32) to 8388608 (2^23)": no trend said."""
    doc, out = _doctor(tmp_path, capsys, _CHAT)
    assert doc["signals"]["loss_scale"]["says"] == (
        "The loss scale falls from 4294967296 (2^32) to 8388608 (2^23) with an overflow on every step from step 1852 "
        "to 1860 (18 overflow line(s)), past a run's start: the gradients overflow step after step, not a scale "
        "calibrating (that halves for a few steps at the start)."
    )
    assert doc["summary"]["benign"] is None and "calibrating at a run's start" not in out


# g. a step from a bar of one epoch, and fairseq's update count

# ColossalChat's SFT trainer (hpcaitech/ColossalAI at caab4a30, applications/ColossalChat/coati/trainer/sft.py,
# SFTTrainer._train): `trange(len(train_dataloader) // accumulation_steps, desc=f"Epoch {epoch + 1}/{self.max_epochs}")`,
# its postfix `{"train/loss": ...}`: the bar counts the steps within its epoch
_EPOCH_BAR = "".join(
    f"Epoch 2/3:  45%|████▌     | {count}/1000 [10:0{count - 450}<12:00,  1.31s/it, train/loss={loss}]\n"
    for count, loss in ((450, "2.13"), (451, "nan"))
)
# fairseq's SimpleProgressBar (facebookresearch/fairseq at 3d262bb2, fairseq/logging/progress_bar.py:284 `{}:  {:5d} /
# {:d} {}` within the epoch, :293 `{} | {}` at its end): the update count is `num_updates`
_FAIRSEQ = (
    "2021-03-04 10:00:00 | INFO | train_inner | epoch 002:    100 / 1234 loss=9.9, nll_loss=9.8, ppl=891.4, "
    "wps=12000, ups=3, wpb=4000, bsz=128, num_updates=1334, lr=0.0005, gnorm=1.234, loss_scale=8, train_wall=35, "
    "wall=40\n"
    "2021-03-04 10:00:30 | INFO | train | epoch 002 | loss nan | nll_loss nan | ppl nan | wps 12000 | ups 3 | wpb 4000 "
    "| bsz 128 | num_updates 2468 | lr 0.0005 | gnorm nan | loss_scale 8 | train_wall 450 | wall 500\n"
)


def test_g_a_bar_of_one_epoch_gives_the_global_step(tmp_path, capsys):
    """Round 5: step 451, the count within epoch 2."""
    doc, out = _doctor(tmp_path, capsys, _EPOCH_BAR)
    assert _first(doc) == (2, "train/loss", 1451, None)
    assert doc["metrics"]["first_nonfinite"]["step_from"] == (
        "the progress bar on its line, 451/1000 (the bar counts within epoch 2/3, its description: (2 - 1) x 1000 + "
        "451, each epoch 1000 steps)"
    )
    assert "The first non-finite metric: train/loss at step 1451 (line 2)." in out


def test_g_a_first_epoch_s_bar_is_the_step(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _EPOCH_BAR.replace("Epoch 2/3", "Epoch 1/3"))
    assert _first(doc) == (2, "train/loss", 451, None)


def test_g_fairseq_num_updates_is_the_step(tmp_path, capsys):
    """Round 5: "loss (the line names no step)"."""
    doc, out = _doctor(tmp_path, capsys, _FAIRSEQ)
    assert _first(doc) == (2, "loss", 2468, None)
    assert "The first non-finite metric: loss at step 2468 (line 2), with " in out


# every new pattern is linear: a line of about 100 KB built to make a backtracking one hang is read at once (a hang
# check, 10 CPU seconds where a linear reader takes well under one, as tests/cli/test_doctor_hostile.py: not a speed)
CRAFTED = {
    "words before a colon and a value": "  " + "a " * 50_000 + ": nan",
    "bracketed names": "[step] " + "[Loss] " * 14_000 + "nan",
    "a number before an average": "loss: 1" + "1." * 50_000 + " (nan",
    "meters without averages": "loss: 1 " * 12_000 + "(nan)",
    "Marian's update count": "Ep. 1 : Up. " + "1" * 100_000 + " : Cost nan",
    "bare brackets": "[1] " * 25_000 + "loss nan",
    "guard flags": "Bad probs detected: " + "NaN: True, " * 9_000,
    "a counter's numbers": "1 " * 50_000 + "nan",
    "epoch bar descriptions": "Epoch 2/3: " * 9_000 + " 45%| | 451/1000 [10:01<12:00, loss=nan]",
    "iteration headers": "Learning iteration 1/" * 5_000 + "\n  Value function loss: nan",
}


@pytest.mark.parametrize("text", list(CRAFTED.values()), ids=list(CRAFTED))
def test_each_new_reader_of_a_line_is_linear(text):
    start = time.process_time()
    found = logs.scan([text.encode() + b"\n"], "crafted")
    assert time.process_time() - start < 10, "a reader is not linear on this line"
    assert found is None or len(found.context) < 100_000
