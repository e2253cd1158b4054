"""Issue 41, round 19: what the consumed holdouts still read only partly, and the classes of holdout19 (reports doctor
had never read), on crafted input of each class. Each test fails on round 18's doctor (main e19a80e)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. a split's word before the metric (nanoGPT's `step N: train loss X, val loss Y`, holdout17 21): both keys said
def test_1_a_split_word_stays_with_its_metric(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "step 100000: train loss nan, val loss nan\n")
    assert doc["summary"]["metric"] == "train loss"
    assert (
        "at or before step 100000 (the line); the input's first record of it, so an earlier step may have been "
        "too: train loss nan, val loss nan"
    ) in out


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
    assert f"{name}, printed at the prompt on the line before: its values nan" in out


def test_2_a_debugger_command_names_nothing(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "(Pdb) c\ntensor([[nan]], device='cuda:0')\n")
    assert "printed at the prompt" not in out
    assert doc["summary"]["metric"] in (None, "-")


# 3. the check's message after `iteration I: `, its `Unexpected result nan (message=` left out (a NeMo-RL post-mortem's
# paste, holdout19 11): the iteration it names
def test_3_the_iteration_before_a_bare_message_is_read(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "RuntimeError: iteration 103: found NaN in local grad norm for bucket #0\n")
    assert doc["failure"]["iteration"] == 103
    assert doc["summary"]["step"] == 103
    assert "The error line names iteration 103." in out


# 4. Megatron's iteration line before its own error (MaskLLM's log, holdout19 09): the iteration done before it
_ASSERTED = (
    " iteration     1093/    2000 | consumed samples:       279808 | elapsed time per iteration (ms): 217580.9 | "
    "learning rate: 1.288E-04 | global batch size:   256 | lm loss: 2.607045E+00 | loss scale: 1.0 |\n"
    "Traceback (most recent call last):\n"
    "AssertionError: Rank 5: found NaN in local grad norm in backward pass before data-parallel communication "
    "collective. Device: 5, node: hd02-gpu1-0056\n"
)


def test_4_megatrons_iteration_line_before_its_error_gives_the_iteration_after(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ASSERTED)
    assert doc["summary"]["step"] is None
    assert doc["summary"]["after_step"] == 1093
    assert ("The error came after iteration 1093: Megatron's iteration line 2 line(s) before it (line 1) logged that "
            "iteration done.") in out  # fmt: skip


def test_4_no_iteration_line_no_after_step(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ASSERTED.split("\n", 1)[1])
    assert doc["summary"]["after_step"] is None
    assert "came after iteration" not in out


# 5. a message whose last word is wrapped or misread (`... communication collectie` + `ve. Device: 5`: holdout19 10,
# a log read off a screenshot): the message before that word, and its rank
def test_5_a_message_whose_last_word_is_broken_is_read_cut(tmp_path, capsys):
    text = ("AssertionError: Rank 13: found NaN in local grad norm in backward pass before data-parallel "
            "communication collectie\nve. Device: 5, node: node-15-11\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["failure"]["rank"] == 13
    assert doc["summary"]["check"] == "grad-norm-nan"
    assert "Rank 13 found NaN in its local gradient norm before the data-parallel reduce" in out


# 6. a word of a sentence before `nan` is no metric's name (`number of nan iterations:` cut after `nan`)
@pytest.mark.parametrize("line", ["ad norm: 36.838 ] number of nan iterations:", "grad norm: 2.1 ] number of nan iterations:"])  # fmt: skip
def test_6_a_function_word_is_no_metric(tmp_path, capsys, line):
    doc, _ = _doctor(tmp_path, capsys, line + "\n")
    assert doc["summary"]["metric"] is None


# 7. Megatron-LM's pretrain script with DeepSpeed's flags is Megatron-DeepSpeed's (holdout19 06)
def test_7_a_pretrain_script_with_deepspeed_flags_is_megatron_deepspeed(tmp_path, capsys):
    script = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 2 "
              "--fp16 --deepspeed_config=./ds.json --deepspeed\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, "step 3: loss nan\n", script=script)
    assert (doc["framework"]["name"], doc["framework"]["how"]) == ("megatron-deepspeed",
                                                                   "pretrain_gpt.py with --deepspeed_config")  # fmt: skip


# 8. a name keeps its capitals after `On rank N, ` (holdout19 12: `On rank 0, deepSpeed's fp16 loss scale ...`)
def test_8_a_name_keeps_its_capitals_mid_sentence(tmp_path, capsys):
    text = "[rank0]: Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
    _, out = _doctor(tmp_path, capsys, text)
    assert "On rank 0, DeepSpeed's fp16 loss scale reached its minimum" in out


# 9. a Trainer dict's own epoch where it names no step (holdout19 04, 05)
def test_9_a_trainer_dicts_epoch_is_said(tmp_path, capsys):
    text = "{'eval_loss': nan, 'eval_runtime': 147.7, 'eval_samples_per_second': 13.5, 'epoch': 0.52}\n"
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["epoch"] == "0.52"
    assert doc["metrics"]["first_nonfinite"]["epoch"] == "0.52"
    assert "eval_loss (the line names no step; epoch 0.52)" in out


# 10. a Trainer-logged loss of 0.0 right after a non-zero one: a window whose every step's loss was NaN or Inf, left
# out by logging_nan_inf_filter (alpaca-lora's log, holdout19 04)
_ZEROED = ("{'loss': 260.8695, 'learning_rate': 0.0, 'epoch': 0.36}\n"
           "{'loss': 61674848.0, 'learning_rate': 3e-06, 'epoch': 0.39}\n"
           "{'loss': 0.0, 'learning_rate': 3e-06, 'epoch': 0.41}\n")  # fmt: skip


def test_10_a_trainer_loss_of_zero_after_a_loss_is_said(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ZEROED)
    assert doc["metrics"]["trainer_loss_zeroed"] == {"line": 3, "step": None, "epoch": "0.41", "before": 61674848.0}
    assert "Its Trainer-logged loss fell from 6.16748e+07 to 0.0 at line 3 (epoch 0.41)" in out


def test_10_a_first_loss_of_zero_is_no_fall(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "{'loss': 0.0, 'learning_rate': 3e-06, 'epoch': 0.41}\n" + _ZEROED)
    assert doc["metrics"]["trainer_loss_zeroed"]["line"] == 4


def test_10_a_non_finite_gradient_beside_a_trainer_loss_of_zero(tmp_path, capsys):
    text = "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.46e-07, 'epoch': 0.0}\n"
    _, out = _doctor(tmp_path, capsys, text)
    assert "a non-finite gradient norm beside a logged loss of 0.0: transformers' Trainer logs 0.0" in out


# 11. a skip counter before the overflow line is not said at the overflow's step (holdout19 06: `skipped=1` at step 1,
# line 1; the overflow at step 2499)
def test_11_a_counter_before_the_overflow_is_not_given_its_step(tmp_path, capsys):
    log = ("[INFO] [logging.py:96:log_dist] [Rank 0] step=1, skipped=1, lr=[0.0, 0.0], mom=[(0.9, 0.95)]\n"
           "[INFO] [logging.py:96:log_dist] [Rank 0] Overflow detected. Skipping step. Attempted loss scale: 1, "
           "reducing to 1\n"
           "[INFO] [logging.py:96:log_dist] [Rank 0] step=2499, skipped=1585, lr=[0.0001371], mom=[(0.9, 0.95)]\n")  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert "A skip counter rose: skipped (line 1), to 1585 by step 2499 (line 3): 1585 of 2499 steps skipped." in out


# 12. Megatron's raise form wrapped over lines by hand (holdout19 13, 20): its rank, iteration and message
@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: Rank 189, node lshb-3, device 5,\n  iteration 2: Unexpected result nan\n"
        "  (message='found NaN in local forward loss calculation')\n",
        "RuntimeError: Rank 189, node lshb-3, device 5, iteration 2:\nUnexpected result nan\n"
        "message='found NaN in local forward loss calculation'\n",
    ],
)
def test_12_a_raise_form_wrapped_over_lines_is_read_whole(tmp_path, capsys, text):
    doc, out = _doctor(tmp_path, capsys, text)
    assert (doc["failure"]["rank"], doc["failure"]["node"], doc["failure"]["iteration"]) == (189, "lshb-3", 2)
    assert doc["summary"]["check"] == "forward-loss-nan"
    assert "Rank 189 found NaN in its local forward loss" in out


# 13. a record printed a key per line (a W&B run summary, holdout19 21): its `_step` gives the step
def test_13_a_key_per_line_records_step_key_gives_the_step(tmp_path, capsys):
    text = "_step: 218\ncritic/score/mean: 0.05\nactor/kl_loss: NaN\nactor/pg_loss: NaN\n"
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["step"] == 218
    assert "step 218 (the record it is in (line 1: `_step: 218`))" in out


def test_13_a_blank_line_ends_the_record(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "_step: 218\n\ncritic/score/mean: 0.05\nactor/kl_loss: NaN\n")
    assert doc["summary"]["step"] is None


# 14. AMD's Primus is named by its CLI's `[Primus] Error:` line (holdout19 16, 17)
def test_14_primus_is_named_by_its_error_line(tmp_path, capsys):
    text = ("[20260407 12:15:08][rank-55/256][DEBUG] [__main__.py:189] : [Primus] Error: RuntimeError: Training "
            "execution failed: Rank 55, node g21u01, device 7, iteration 1: Unexpected result nan (message='found "
            "NaN in local grad norm for bucket #0 in backward pass before data-parallel communication collective')\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["framework"]["name"] == "primus"
    assert doc["failure"]["rank"] == 55


# 15. rsl-rl's `Mean value_function loss:` (v2.3.0 on) is the critic's (holdout19 18)
def test_15_rsl_rl_value_function_loss_is_the_critics(tmp_path, capsys):
    text = "Learning iteration 208/8000\nMean value_function loss: inf\nMean surrogate loss: 0.0000\n"
    doc, _ = _doctor(tmp_path, capsys, text)
    assert (doc["summary"]["metric"], doc["summary"]["model"]) == ("Mean value_function loss", "critic")


# holdout20 (a fourth blind collector: run output committed to repositories), read on main 3f840a9


# 16. NeMo-Aligner's SFT bar (`train_grad_norm=nan, ..., train_loss=1.57`): NeMo's, a gradient norm beside a finite loss
def test_16_nemo_aligner_s_bar_is_named_and_its_train_terms_read(tmp_path, capsys):
    text = ("Training steps:   0%|          | 0/1876 [01:54<?, ?it/s, train_grad_norm=nan, train_lr=0, "
            "train_loss=1.57, train_consumed_samples=8, train_step_time=114, train_epoch=1]\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["framework"]["name"] == "nemo"
    assert doc["summary"]["points_to"].startswith("the backward pass: the loss on the line is finite")


# 17. a GRPO kl alone non-finite beside a loss of 0 and a finite gradient norm (Unsloth's GRPO log, holdout20 07, 08)
def test_17_a_kl_beside_a_finite_gradient_is_a_statistic(tmp_path, capsys):
    text = ("{'loss': 0.0, 'grad_norm': 0.1259, 'learning_rate': 6e-06, 'reward': 1.02, 'reward_std': 0.78, "
            "'completion_length': 230.1, 'kl': nan, 'epoch': 0.0}\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["points_to"].startswith(
        "a logged statistic only on the line, maybe more in a step of its window: TRL's GRPO logs its metrics as "
        "means over the logging window's steps (trl v0.16.0 grpo_trainer.py:956)"
    )  # round 31: a window's mean, and a term of each step's loss (not 'not a diverged model')


# 18. a check's own flag set true (`GRAD_NaN ... nan=True inf=False`: a hook's line, holdout20 10)
def test_18_a_checks_nan_flag_set_true_is_evidence(tmp_path, capsys):
    text = "GRAD_NaN fwd=1 llm_input shape=[2, 2314, 4096] nan=True inf=False\n"
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["check"] == "nonfinite-message"
    assert doc["summary"]["metric"] != "True"
    assert "A check's flag says a value it checked held NaN or Inf (line 1" in out


@pytest.mark.parametrize("text", ["nan=False inf=False\n", "check: has_nan=False\n"])
def test_18_a_flag_set_false_is_no_evidence(tmp_path, capsys, text):
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["check"] is None
    assert doc["summary"]["metric"] is None


# the review's cases (each a false reading the first version of round 19 made)
def test_r1_a_trainer_banners_total_steps_is_no_step(tmp_path, capsys):
    text = ("***** Running training *****\n  Num examples = 1,000\n  Num Epochs = 3\n"
            "  Total optimization steps = 750\n  Gradient Accumulation steps = 1\n"
            "{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.01}\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["step"] is None


def test_r2_prose_naming_the_check_is_no_failure(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "After upgrading, the job also found NaN in local grad norm sometimes\n")
    assert doc["failure"]["check"] is None


@pytest.mark.parametrize("line, points", [("iter 100: train loss 2.31, grad_norm nan", "the backward pass: the loss"),
                                          ("iter 100: train loss 0.0, grad_norm nan", "a non-finite gradient norm beside a loss of 0")])  # fmt: skip
def test_r3_a_train_split_loss_is_a_loss(tmp_path, capsys, line, points):
    doc, _ = _doctor(tmp_path, capsys, line + "\n")
    assert doc["summary"]["points_to"].startswith(points)


@pytest.mark.parametrize("text", ["{'step': 10, 'loss': 2.1, 'epoch': 0.1}\n{'step': 20, 'loss': 0.0, 'epoch': 0.2}\n",
                                  "{'loss': 0.0001, 'grad_norm': 0.52, 'epoch': 0.1}\n{'loss': 0.0, 'grad_norm': 0.41, 'epoch': 0.2}\n",
                                  "{'loss': 0.5, 'grad_norm': 0.52, 'epoch': 0.1}\n{'loss': 0.0, 'grad_norm': 0.41, 'epoch': 0.2}\n"])  # fmt: skip
def test_r4_a_loss_of_zero_the_trainer_filter_cannot_explain(tmp_path, capsys, text):
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["metrics"]["trainer_loss_zeroed"] is None
    assert "Trainer-logged loss fell" not in out


def test_r5_a_checkpoint_load_between_ends_the_iteration_before(tmp_path, capsys):
    text = (" iteration      428/    5000 | consumed samples: 6848 | lm loss: 2.1 | loss scale: 1.0 |\n"
            " loading checkpoint from /ckpt at iteration 400\n"
            " successfully loaded checkpoint from /ckpt at iteration 400\n"
            "RuntimeError: Rank 0, node n0, device 0: Unexpected result nan (message='found NaN in local grad norm for "
            "bucket #0 in backward pass before data-parallel communication collective')\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["after_step"] is None


@pytest.mark.parametrize("text", ["debug config:\n  nan: True\n  inf: True\n"])
def test_r6_a_configs_echo_is_no_flag(tmp_path, capsys, text):
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["check"] is None


def test_r7_a_function_word_keyed_with_a_colon_is_a_key(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "step 5: Losses -- a: nan, in: 2.3\n")
    assert doc["summary"]["metric"] == "a"
