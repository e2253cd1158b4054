"""Issue 41, rounds 21 and 22: the classes of holdout21 and holdout22 (reports doctor had never read), what holdout20
still read only partly, and the false readings a review of round 21 found, on crafted input of each class. Each
positive test fails on round 20's doctor (main ee8e551); those of round 22 and the review on round 21's (acaa06a)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


_RAISED = (
    "[rank13]: RuntimeError: Rank 13, node worker1, device 5, iteration 1: Unexpected result nan (message='found NaN "
    "in local grad norm for bucket #0 in backward pass before data-parallel communication collective')\n"
)
_SWIFT = (
    "NNODES=2 NPROC_PER_NODE=8 megatron sft \\\n    --model Qwen/Qwen3-30B-A3B \\\n    --dataset <data_path> \\\n"
    "    --train_type lora \\\n    --expert_model_parallel_size 8 \\\n    --pipeline_model_parallel_size 2\n"
)


# 1. a non-slime job's failing rank placed in its layout (ms-swift's Megatron backend, holdout21 02): the rank's
# table and notes speak of that job, not of slime's placement, loss or iteration counter
def test_1_a_non_slime_rank_is_placed_without_slime_words(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _RAISED, _SWIFT)
    assert doc["framework"]["name"] == "ms-swift"
    assert "nodes in the launcher's order, each filled before the next" in out
    assert "yes: final norm + output layer (and the loss)" in out
    assert ("iteration 1: the RerunStateMachine's counter, advanced each iteration by the training loop this job "
            "runs (Megatron-LM's, or Megatron-Bridge's: should_run_forward_backward)") in out  # fmt: skip
    said = out.replace("slime's rules do not apply", "")
    for word in ("slime's placement", "slime's loss", "slime v0.1.0", "slime and most jobs"):
        assert word not in said


# 2. a value left out as `<data_path>` (holdout21 02's `--dataset <data_path> \`): a word, not bash's redirections
# that took the next line's flag as their file and cut the command; its layout read past it
def test_2_an_angle_bracket_placeholder_is_a_value(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _RAISED, _SWIFT)
    assert (doc["topology"]["pp"], doc["topology"]["ep"], doc["topology"]["world"]) == (2, 8, 16)
    assert "line 3: `<data_path>` read as value(s) the poster left out" in out
    assert doc["failing_rank"]["pp"] == 1


@pytest.mark.parametrize("script", ["python train.py < input.txt > out.log\n", "python train.py 2>&1 | tee x\n"])
def test_2_a_redirection_is_no_placeholder(tmp_path, capsys, script):
    _, out = _doctor(tmp_path, capsys, _RAISED, script)
    assert "the poster left out" not in out


# 3. a command copied from an interactive shell, bash's `> ` continuation prompt on each continued line (holdout21
# 09): the command read, not the `>` lines taken for Markdown quotes without their first line
def test_3_a_shell_continuation_prompt_is_dropped(tmp_path, capsys):
    script = "CUDA_VISIBLE_DEVICES=2 python train_grpo.py \\\n>   --learning-rate 5e-6 \\\n>   --max-steps 20\n"
    doc, out = _doctor(
        tmp_path, capsys, "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 0.0, 'epoch': 0.0}\n", script
    )
    assert "train.sh (train_grpo.py, line 1)" in out
    assert "read as a command copied from a shell: the `> ` continuation prompts dropped" in out
    assert "no train command found" not in out


# 4. DeepSpeed's overflow line printed by every DP rank's optimizer, the same halving on consecutive lines (holdout21
# 04, holdout17 10): one overflow, not the scale grown back and halved again
_ZERO1 = ("[2021-03-18 04:21:58,423] [INFO] [stage1.py:633:step] [deepspeed] fp16 dynamic loss scale overflow! "
          "Skipping step. Attempted loss scale: 131072.0, reducing to 65536.0\n")  # fmt: skip


def test_4_the_same_overflow_from_several_processes_is_one(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ZERO1 * 3)
    assert "grows back" not in out
    assert (
        "The first attempted loss scale is 131072 (2^17), as high as fp16 loss scalers start (2^16 or more), and it halves once"
        in out
    )
    assert "(2 more line(s) repeat an overflow on the line just before it: the same overflow printed by another " in out
    assert doc["signals"]["loss_scale"]["copies"] == 2


def test_4_a_scale_grown_back_later_still_oscillates(tmp_path, capsys):
    later = _ZERO1.replace("131072.0, reducing to 65536.0", "65536.0, reducing to 32768.0")
    _, out = _doctor(tmp_path, capsys, _ZERO1 + later + "step 900 loss 2.1\n" + _ZERO1)
    assert "The loss scale grows back between overflows" in out


def test_4_a_scale_kept_by_its_hysteresis_does_not_halve(tmp_path, capsys):
    line = ("[2024-01-05 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
            "step. Attempted loss scale: 131072, but hysteresis is 2. Reducing hysteresis to 1\n")  # fmt: skip
    _, out = _doctor(tmp_path, capsys, line)
    assert "halves" not in out
    assert "and it is kept (the overflow spent the scaler's hysteresis)" in out


# 5. Megatron's error alone, no frame or flag naming the job's framework (holdout21 01): the framework unknown, but
# megatron-core's
_ASSERTED = ("[rank3]: AssertionError: Rank 3: found NaN in local grad norm in backward pass before data-parallel "
             "communication collective. Device: 3, node: Du\n")  # fmt: skip


def test_5_megatrons_error_alone_says_megatron_core_runs_the_job(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ASSERTED)
    assert doc["framework"] == {"name": "unknown", "release": None,
                                "how": "nothing names the job's framework; megatron-core runs it: Megatron's error "
                                       "line (line 1)", "stack": None}  # fmt: skip
    assert (
        "Nothing in the log names a framework nanscope catalogues; megatron-core runs the job (Megatron's error line (line 1))"
        in out
    )


# 6. a site wrapper running a framework's own example script (`sh run_mcore_llama3_1.sh dsw 8B 1 ...`, holdout21 01):
# the framework that script's name belongs to
def test_6_a_wrapper_running_pais_example_script_names_pai(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ASSERTED, "UB_SKIPMC=1 sh run_mcore_llama3_1.sh  \\\ndsw  \\\n8B   \\\n1\n")
    assert doc["framework"]["name"] == "pai-megatron-patch"
    assert "the launch script runs run_mcore_llama3_1.sh, the name of Pai-Megatron-Patch's" in out


def test_6_another_wrapper_names_nothing(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _ASSERTED, "sh run_llama.sh dsw 8B\n")
    assert doc["framework"]["name"] == "unknown"


# 7. TRL's GRPO metrics without a kl (beta 0: JuncyLu/trl_DAPO, holdout21 10): reward_std and frac_reward_zero_std
def test_7_grpo_keys_without_kl_name_trl(tmp_path, capsys):
    line = ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05, 'reward': 0.3, 'reward_std': 0.0, "
            "'frac_reward_zero_std': 1.0, 'epoch': 0.01}\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, line)
    assert doc["framework"]["name"] == "trl"


# 8. a logging callback's check on a metric it logs, glued after the bar's count (`20/29790 [...]⚠️  Warning: Metric
# attention/early/mdi is NaN/Inf: nan`, holdout21 10): the step the bar shows, not the next; `NaN/Inf` no key
def test_8_a_metric_check_glued_after_a_bar_is_that_steps(tmp_path, capsys):
    text = ("  0%|          | 20/29790 [02:00<25:35:01,  3.09s/it]⚠️  Warning: Metric attention/early/mdi is NaN/Inf: "
            "nan\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["step"] == 20
    assert doc["summary"]["metric"] == "attention/early/mdi"
    assert "NaN/Inf nan" not in out


# 9. a banner's setting whose name ends in a step's word (Unsloth's `Gradient accumulation steps = 8`, holdout21 09,
# holdout20 07): no step
_BANNER = ("==((====))==  Unsloth - 2x faster free finetuning | Num GPUs used = 1\n"
           "   \\\\   /|    Num examples = 12,709 | Num Epochs = 1 | Total steps = 20\n"
           "O^O/ \\_/ \\    Batch size per device = 4 | Gradient accumulation steps = 8\n")  # fmt: skip
_DICT = "{'loss': -0.0, 'grad_norm': nan, 'learning_rate': 0.0, 'reward': 0.5, 'kl': 0.0, 'epoch': 0.0}\n"


def test_9_a_settings_step_word_is_no_step(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _BANNER + _DICT)
    assert doc["summary"]["after_step"] is None
    assert "after step 8" not in out


# 10. one Trainer dict a step between two bars of one loop (`0/20`, five dicts, `5/20`: holdout21 09): the first is
# step 1
def test_10_as_many_dicts_as_steps_between_two_bars_are_one_a_step(tmp_path, capsys):
    bar = "  {p}%|#####      | {n}/20 [00:10<00:30, 52.17s/it]\n"
    doc, out = _doctor(tmp_path, capsys, bar.format(p=0, n=0) + _DICT * 5 + bar.format(p=25, n=5))
    assert doc["summary"]["step"] == 1
    assert "step 1 (the first of 5 dicts between the progress bars at 0 and 5/20: one a step)" in out


# 11. a dict right after a bar's count, the next bar several steps on (a notebook keeps a bar's last state before
# each printed line: holdout20 07's `3/200`, dict, `6/200`): the bar before's step
def test_11_a_bar_steps_past_the_dict_is_no_redraw_of_its_step(tmp_path, capsys):
    bar = "  {p}% {n}/200 [01:40<1:50:05, 33.53s/it]\n"
    doc, _ = _doctor(tmp_path, capsys, bar.format(p=2, n=3) + _DICT + bar.format(p=3, n=6))
    assert doc["summary"]["step"] == 3


def test_11_an_evaluation_bar_before_is_not_the_training_bar(tmp_path, capsys):
    text = (" 95%|#####| 19/20 [00:16<00:00,  1.08it/s]\n{'eval_loss': inf, 'eval_runtime': 18.4, 'epoch': 3.0}\n"
            " 75%|#####| 60/80 [04:42<00:59,  2.97s/it]\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["step"] == 60


# 12. Megatron-Bridge's performance script: every GPU as --num_gpus, a node's as --gpus_per_node (holdout14 05)
def test_12_megatron_bridges_num_gpus_is_the_world(tmp_path, capsys):
    script = ("python scripts/performance/setup_experiment.py --model_family_name deepseek --num_gpus 1024 "
              "--gpus_per_node 8 --pipeline_model_parallel_size 8\n")  # fmt: skip
    log = " [NeMo I 2025-01-01 00:00:00 nemo_logging:393] iteration 10/50 | grad norm: nan | lm loss: 7.1\n"
    doc, out = _doctor(tmp_path, capsys, log, script)
    assert doc["framework"]["name"] == "nemo"
    # its recipe sets TP, CP and EP, which nanscope does not read: no layout of Megatron's defaults (round 30)
    assert doc["topology"] is None
    assert (
        "its recipe sets TP, CP, EP, not read here, so nemo's ranks are not placed; world 1024 = 128 nodes x 8" in out
    )


# 13. a NaN gradient norm beside a loss logged as -0.0 (holdout21 09: TRL GRPO under Unsloth, rewards and kl finite):
# a computed sum, so a step of the window had a finite loss; a GRPO loss of 0.0 beside finite rewards may be either
def test_13_a_loss_logged_as_negative_zero_was_computed(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, _DICT)
    assert ("a non-finite gradient norm beside a logged loss of -0.0: a computed sum, rounded from a tiny negative "
            "value") in out  # fmt: skip
    assert "so at least one step of the logging window had a finite loss" in out


def test_13_a_grpo_zero_loss_beside_finite_rewards_is_either(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, _DICT.replace("'loss': -0.0", "'loss': 0.0"))
    assert ("or an RL loss 0 by construction (TRL's GRPO trains each generation batch once by default, so its "
            "probability ratio is 1 at every step") in out  # fmt: skip
    assert "the line cannot tell which" in out


def test_13_a_trainer_zero_loss_without_rewards_is_still_a_filtered_window(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}\n")
    assert "transformers' Trainer logs 0.0 for a logging window whose every step's loss was NaN" in out
    assert "the line cannot tell which" not in out


# review of round 21: verl places nodes sorted by IP and drives Megatron's schedule itself (no iteration of its own)
def test_1_verl_with_megatron_is_placed_by_ip_and_its_iteration_is_not_verls(tmp_path, capsys):
    script = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.strategy=megatron trainer.nnodes=2 "
              "trainer.n_gpus_per_node=8\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, _RAISED, script)
    assert doc["framework"]["name"] == "verl"
    assert "nodes in verl's placement order: sorted by IP" in out
    assert "verl and ROLL drive the schedule themselves and leave it at -1" in out


# review of round 21: a `<tag>` inside quotes is the poster's text, not a placeholder (a GRPO system prompt)
def test_2_an_angle_bracket_word_inside_quotes_is_left_alone(tmp_path, capsys):
    script = _SWIFT.replace("--train_type lora", "--system 'Think inside <think> </think> tags.'")
    doc, out = _doctor(tmp_path, capsys, _RAISED, script)
    assert (doc["topology"]["pp"], doc["topology"]["ep"]) == (2, 8)
    assert "`<think>`" not in out


# review of round 21: a continuation prompt in a fenced paste; a script's `\` then `> log 2>&1` its redirection
def test_3_continuation_prompts_inside_a_fence_are_dropped(tmp_path, capsys):
    script = "Run:\n```bash\n$ python train_grpo.py \\\n>   --learning_rate 5e-6 \\\n>   --bf16\n```\n"
    _, out = _doctor(tmp_path, capsys, _DICT, script)
    assert "train.sh (train_grpo.py, line 3)" in out
    assert "bash's `> ` continuation prompts" in out


def test_3_a_redirection_after_a_continued_line_is_no_prompt(tmp_path, capsys):
    script = "python train.py \\\n  --fp16 \\\n> logs/train.log 2>&1 &\n"
    doc, out = _doctor(tmp_path, capsys, _DICT, script)
    assert "train.sh (train.py, line 1)" in out
    assert "continuation prompts" not in out and "Markdown" not in out


# review of round 21: DeepSpeed's rank-0 overflow line grep'd, an hour apart: two overflows, the scale grown back
def test_4_one_ranks_overflows_at_other_times_are_not_copies(tmp_path, capsys):
    line = ("[2024-05-01 10:{m}:11] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
            "step. Attempted loss scale: 65536, reducing to 32768\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, line.format(m="02") + line.format(m="41"))
    assert doc["signals"]["loss_scale"]["copies"] == 0
    assert "The loss scale grows back between overflows" in out


# review of round 21: a terminal's bar before a dict lags (tqdm's mininterval), its redraw after is the dict's step;
# an evaluation's dict is no logging step; one dict every 2 steps between two bars
def test_11_a_terminal_bar_after_a_dict_is_its_step(tmp_path, capsys):
    text = (" 63%|######3   | 38/60 [00:02<00:01, 19.0it/s]\n\n" + _DICT
            + " 67%|######6   | 40/60 [00:02<00:01, 19.0it/s]\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, text)
    assert doc["summary"]["step"] == 40


def test_10_an_evaluation_dict_is_no_logging_step(tmp_path, capsys):
    bar = "  {p}%|#   | {n}/20 [00:10<00:30, 2.0s/it]\n"
    evaluation = "{'eval_loss': nan, 'eval_runtime': 1.0, 'epoch': 0.1}\n"
    doc, _ = _doctor(tmp_path, capsys, bar.format(p=0, n=0) + _DICT + evaluation + bar.format(p=10, n=2))
    assert doc["summary"]["step"] == 2


def test_10_one_dict_every_two_steps(tmp_path, capsys):
    bar = "  {p}%|#   | {n}/20 [00:10<00:30, 2.0s/it]\n"
    doc, out = _doctor(tmp_path, capsys, bar.format(p=0, n=0) + _DICT * 5 + bar.format(p=50, n=10))
    assert doc["summary"]["step"] == 2
    assert "the first of 5 dicts between the progress bars at 0 and 10/20: one every 2 steps" in out


# review of round 21 (holdout22 04): a terminal's bar redrawn after a dict, then another dict: a later log
def test_11_a_dict_after_the_bar_redrawn_after_another_is_later(tmp_path, capsys):
    text = ("{'loss': 3.5249, 'grad_norm': 100.7, 'learning_rate': 0.0, 'epoch': 1.0}\n"
            "  0%|#   | 1/300 [00:02<11:15,  2.26s/it]huggingface/tokenizers: The current process just got forked\n"
            "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 3.3e-10, 'epoch': 2.0}\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, text)
    assert (doc["summary"]["step"], doc["summary"]["after_step"]) == (None, 1)


# holdout22 01: a Trainer dict a paste broke over lines at a fixed width, mid-word: one record (its reward_std nan on
# the second line is the same step's: a group of one sample's std)
def test_14_a_dict_broken_over_lines_is_one_record(tmp_path, capsys):
    text = ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 0.0, 'rewards/strict_format_re\n"
            "ward_func': 0.0, 'reward': 0.216, 'reward_std': nan, 'k\nl': 0.0, 'epoch': 2.12}\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, text)
    assert doc["metrics"]["first_nonfinite"]["values"] == [["grad_norm", "nan"], ["reward_std", "nan"]]
    assert "What it points to: the reward: a reward function's NaN, or the spread of a group of one sample" in out
    assert doc["metrics"]["later_nonfinite_lines"] == 0


# holdout22 03: NeMo AutoModel's recipe (FSDP2, no megatron-core): its own framework, not NeMo's Megatron
def test_15_nemo_automodels_recipe_names_it(tmp_path, capsys):
    script = "torchrun --nproc-per-node=8 nemo_automodel/recipes/vlm/finetune.py -c gemma4_4b.yaml\n"
    doc, out = _doctor(tmp_path, capsys, "step 11 | loss 2.3224 | grad_norm     nan\n", script)
    assert doc["framework"]["name"] == "nemo-automodel"
    assert doc["megatron_core_evidence"] is None
