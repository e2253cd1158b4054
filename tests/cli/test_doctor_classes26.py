"""Issue 41, round 26: the false readings of holdout26 (3 reports of the issue's stacks doctor had never read, graded
on d1a80c3) and four classes holdout25 left over, on crafted input of each class; each positive test fails on d1a80c3
(4: on b4ff9e6, where they were added)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


_TRL_FRAME = (
    'File ".../trl/trainer/grpo_trainer.py", line 2018, in _generate_and_score_completions\n'
    "    sampling_per_token_logps = [torch.tensor(logps) for logps in sampling_per_token_logps_list]\n"
)


# 1. TRL's GRPO trainer raising torch.tensor's None error on the sampling log-probs (huggingface/trl#6166, holdout26
# 02): TRL writes vLLM's NaN log-prob as None; a NaN of the policy's rollout, not "no value non-finite"
def test_1_trl_s_none_sampling_logprob_is_a_nan_of_the_rollout(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _TRL_FRAME + "RuntimeError: Could not infer dtype of NoneType\n")
    summary = doc["summary"]
    assert (summary["check"], summary["kind"], summary["model"]) == ("none-logprob", "NaN", "policy")
    assert summary["metric"] == "sampling_per_token_logps"
    assert doc["framework"]["name"] == "trl"
    assert "TRL's trainer met a None among a completion's sampling log-probs, its writing of vLLM's NaN log-prob" in out
    assert "no value the text prints is non-finite" not in out


def test_1_the_same_error_under_another_line_names_no_nan(tmp_path, capsys):
    log = (
        'File ".../trl/trainer/grpo_trainer.py", line 1990, in _generate_and_score_completions\n'
        "    completion_ids = [torch.tensor(ids) for ids in completion_ids_list]\n"
        "RuntimeError: Could not infer dtype of NoneType\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["check"] != "none-logprob"
    assert "The traceback ends in an error that names no NaN or Inf" in out


# 2. Trainer dicts one a step between the bars at 0/5 and 5/5, the first finite (brendanlynch9/Wdamm-FLOB2's pasted
# terminal, holdout26 03): the first NaN dict is the second, step 2, not the bar after's 5
def test_2_the_nth_dict_between_two_bars_one_a_step_is_step_n(tmp_path, capsys):
    log = (
        "  0%|          | 0/5 [00:00<?, ?it/s]/x/dataloader.py:692: UserWarning: 'pin_memory' argument is set\n"
        "{'loss': 1.8998, 'grad_norm': 21.921875, 'learning_rate': 1.6e-05, 'epoch': 0.4}\n"
        "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1.2e-05, 'epoch': 0.8}\n"
        "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 8e-06, 'epoch': 1.2}\n"
        "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4e-06, 'epoch': 1.6}\n"
        "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 0.0, 'epoch': 2.0}\n"
        "{'train_runtime': 1228.98, 'train_loss': 0.37996554374694824, 'epoch': 2.0}\n"
        "100%|██████████| 5/5 [20:29<00:00, 245.81s/it]\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["line"], first["step"]) == (3, 2)
    assert "step 2 (dict 2 of 5 dicts between the progress bars at 0 and 5/5: one a step)" in out


# 3. a group's name before its `key=value` pairs (holdout25 15's `Reward: mean=nan`, icefall's `train_loss[loss=nan,
# ...]`, holdout25 24): the keys are the group's; a caption over indented lines (`Eval metrics at step 6:`) their step
def test_3_a_group_s_name_is_its_keys_own(tmp_path, capsys):
    log = (
        "Eval metrics at step 0:\n  Reward: mean=3.06, min=1.92\n  Steps:  mean=1000.0, min=1000.0\n"
        "Eval metrics at step 6:\n  Steps:  mean=0.0, min=0.0\n  Reward: mean=nan, min=nan, max=nan, std=nan\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["metric"], first["step"]) == ("Reward mean", 6)
    assert "step 6 (the caption over it, line 4: `Eval metrics at step 6:`, its step count)" in out


def test_3_icefall_s_bracketed_tracker_names_its_keys(tmp_path, capsys):
    log = (
        "2023-03-06 12:41:16,653 INFO [trainer.py:694] (2/4) Epoch 1, batch 8500, train_loss[loss=nan, "
        "ArTop10Accuracy=0, over 1266.00 frames. ], tot_loss[loss=nan, over 265830.71 frames. ], batch size: 2\n"
    )
    doc, _ = _doctor(tmp_path, capsys, log)
    assert [key for key, _ in doc["metrics"]["first_nonfinite"]["values"]] == ["train_loss loss", "tot_loss loss"]


def test_3_a_logger_s_level_is_no_group(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "step 3 INFO: loss=nan, acc=0.1\n")
    assert doc["metrics"]["first_nonfinite"]["metric"] == "loss"


# the review's cases: a colon's head names statistics only; other pairs after it keep their keys (and their step)
@pytest.mark.parametrize(
    ("line", "metric", "step"),
    [("Results: val_loss=nan val_acc=0.1 step=5", "val_loss", 5), ("Eval: step=5 loss=nan", "loss", 5)],
)
def test_3_a_caption_before_other_pairs_keeps_their_keys(tmp_path, capsys, line, metric, step):
    doc, _ = _doctor(tmp_path, capsys, line + "\n")
    first = doc["metrics"]["first_nonfinite"]
    assert (first["metric"], first["step"]) == (metric, step)


# Python 3.11's caret line under the code line, and `[rankN]:` prefixes
def test_1_trl_s_none_under_a_caret_line_with_rank_prefixes(tmp_path, capsys):
    log = (
        '[rank0]:   File ".../trl/trainer/grpo_trainer.py", line 1991, in _generate_and_score_completions\n'
        "[rank0]:     sampling_per_token_logps = [torch.tensor(logps) for logps in sampling_per_token_logps_list]\n"
        "[rank0]:                                 ^^^^^^^^^^^^^^^^^^^\n"
        "[rank0]: RuntimeError: Could not infer dtype of NoneType\n"
    )
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["check"], doc["summary"]["rank"]) == ("none-logprob", 0)


# 4. holdout25's other left-over stack wordings: ESPnet2's skip on a non-finite grad norm (espnet/espnet#3170,
# holdout25 22) and guided-diffusion's fp16 trainer lowering its log2 loss scale (openai/guided-diffusion#50, holdout25
# 04): a skipped step, by whose words
@pytest.mark.parametrize("norm", ["nan", "tensor(nan, device='cuda:0')"], ids=["torch-1.4-float", "tensor"])
def test_4_espnet_s_skip_is_a_skipped_step(tmp_path, capsys, norm):
    log = (
        f"[user] 2021-04-23 19:22:52,420 (trainer:581) WARNING: The grad norm is {norm}. Skipping updating the model.\n"
        "[user] 2021-04-23 19:22:56,245 (trainer:636) INFO: 2epoch:train:12009-12640batch: loss=65.129, acc=0.065\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["check"], doc["summary"]["metric"]) == ("skip-nonfinite-grad", "grad_norm")
    assert (
        "ESPnet2's trainer (FunASR's prints the same words) skipped an optimizer step on a non-finite gradient" in out
    )


def test_4_guided_diffusion_s_lowered_log2_scale_is_a_skipped_step(tmp_path, capsys):
    log = "".join(f"Found NaN, decreased lg_loss_scale to {lg}\n" for lg in (18.821, 17.821, 16.821))
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["check"] == "scaler-overflow"
    assert (
        "log2 loss scale -> 18.821; guided-diffusion's fp16 trainer (improved-diffusion's prints the same words)" in out
    )
