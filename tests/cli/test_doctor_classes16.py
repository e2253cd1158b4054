"""Issue 41, round 16: the classes holdout16 (12 reports doctor had never read, graded on main 8f7c89f) read partly,
each on crafted input of its class. Each test fails on round 15's doctor (main 8f7c89f)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. verl's actor names its rank when it skips a step (v0.7.1 dp_actor.py:411; its critic's line names none), after a
# phase line a fork tags with its step (EvolvingLMMs-Lab/multimodal-search-r1#19)
def test_1_verl_s_actor_line_gives_the_rank_the_actor_and_the_tagged_step(tmp_path, capsys):
    log = ("[Global Step: 7] Update Actor Starts ...\n[Global Step: 7] Update Actor Ends ...\n"
           " WARN: rank 3 grad_norm is not finite: inf\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["rank"], doc["summary"]["model"], doc["summary"]["step"]) == (3, "actor", 7)
    assert doc["failure"]["rank_from"] == "the line's words (verl's actor prints its rank)"
    assert "On rank 3, verl's FSDP actor skipped an optimizer step on a non-finite gradient norm at step 7" in out
    assert "The first non-finite metric: grad_norm (the actor) at step 7 (line 3)." in out


def test_1_only_a_global_step_tag_gives_a_step(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "[Step 9] eval done\nWARN: rank 0 grad_norm is not finite: inf\n")
    assert doc["summary"]["step"] is None  # `[Step 9]` may be any loop's (an evaluation's)


def test_1_verl_s_line_without_a_rank_names_no_model(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "WARN: grad_norm is not finite: nan\n")
    assert (doc["summary"]["rank"], doc["summary"]["model"], doc["summary"]["step"]) == (None, None, None)
    assert "verl's FSDP engine or critic skipped an optimizer step" in out


# 2. CUDA's `device-side assert triggered` with the kernel's own assert line beside it (zzzhhzzz/Ground-R1#4): the
# sampling assert is what fired
def test_2_the_kernel_s_probability_assert_leads_the_cuda_error_it_raised(tmp_path, capsys):
    log = ("CUDA error: device-side assert triggered\n"
           "Assertion `probability tensor contains either inf, nan or element < 0` failed.\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["failure"]["check"] == "probability-assert"
    assert "Sampling (torch.multinomial) was given probabilities holding inf, NaN or a negative value (line 2;" in out
    assert "also: device-assert at line 1: CUDA error: device-side assert triggered" in out


def test_2_the_cuda_error_s_rank_stays_with_the_assert_that_leads(tmp_path, capsys):
    log = ("[rank2]: RuntimeError: CUDA error: device-side assert triggered\n"
           "Assertion `probability tensor contains either inf, nan or element < 0` failed.\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["failure"]["check"], doc["failure"]["rank"]) == ("probability-assert", 2)
    assert doc["failure"]["rank_from"] == "the log prefix [rankN]:"


def test_2_an_assert_s_rank_from_the_traceback_after_it_is_said_so(tmp_path, capsys):
    log = ("Assertion `probability tensor contains either inf, nan or element < 0` failed.\n"
           "[rank3]: Traceback (most recent call last):\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["failure"]["rank"], doc["failure"]["rank_from"]) == (
        3, "the log prefix [rankN]: of the traceback line after it")  # fmt: skip


# 3. the code pasted before the multinomial's RuntimeError calls TRL's legacy PPO generation (shibing624/MedicalGPT#440)
def test_3_an_rl_trainer_s_generation_pasted_before_the_error_names_the_policy(tmp_path, capsys):
    log = ("    response_tensors = ppo_trainer.generate(\n        question_tensors,\n        **generation_kwargs,\n"
           "    )\nRuntimeError: probability tensor contains either inf, nan or element < 0\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["model"] == "policy"
    assert (
        "(line 5; torch.multinomial (sampling); a RuntimeError the call raised). The model: the policy (the code "
        "pasted before it calls ppo_trainer.generate: an RL trainer's generation samples its policy)."
    ) in out


@pytest.mark.parametrize(
    "call", ["model.generate(ids)", "self.support_model.generate(ids)", "grpo_data.sample_rows(3)"]
)
def test_3_a_generation_call_of_no_rl_trainer_names_no_model(tmp_path, capsys, call):
    log = f"    out = {call}\nRuntimeError: probability tensor contains either inf, nan or element < 0\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["model"] is None


# 4. RLinf's frames and its Ray actor's repr (RLinf/RLinf#223)
def test_4_rlinf_s_frames_name_it(tmp_path, capsys):
    log = ("(MultiStepRolloutWorker pid=7) [DEBUG] Bad probs detected: NaN: True Neg: False Inf: False\n"
           'Traceback (most recent call last):\n  File "/home/u/RLinf/rlinf/workers/rollout/hf/huggingface_worker.py", '
           "line 149, in generate\n    actions, result = self.predict(env_output[\"obs\"])\n"
           "RuntimeError: CUDA error: device-side assert triggered\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "rlinf"
    assert "framework rlinf, release unknown (frames under rlinf/workers/ (huggingface_worker.py:149 generate))" in out


# 5. axolotl's logger prefix names it (axolotl-ai-cloud/axolotl#2058)
def test_5_axolotl_s_logger_names_it(tmp_path, capsys):
    log = ("[2024-11-14 22:25:08,271] [INFO] [axolotl.callbacks.on_train_begin:794] [PID:3008] [RANK:0] The Axolotl "
           "config has been saved to the WandB run under files.\n"
           "{'loss': 1.4426, 'grad_norm': 1.31, 'learning_rate': 1e-06, 'epoch': 0.0}\n"
           "{'eval_loss': nan, 'eval_runtime': 543.3, 'eval_samples_per_second': 4.787, 'epoch': 0.0}\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "axolotl"


# 6. holdout15 21, left partly by round 15: DeepSpeed-Chat's step 2 trains a reward model, read from its main.py's
# flags (`--num_padding_at_beginning` with `--model_name_or_path`; step 3's RLHF takes the actor's and the critic's)
@pytest.mark.parametrize(
    ("flags", "kind", "model"),
    [("--model_name_or_path bigscience/bloomz-560m", "reward-model", "reward model"),
     ("--actor_model_name_or_path a --critic_model_name_or_path c", "rl", None)],
)  # fmt: skip
def test_6_deepspeed_chat_s_step_is_read_from_its_flags(tmp_path, capsys, flags, kind, model):
    script = f"deepspeed main.py --data_split 6,2,2 {flags} --num_padding_at_beginning 1 --zero_stage 3\n"
    log = "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
    doc, out = _doctor(tmp_path, capsys, log, script)
    assert (doc["framework"]["name"], doc["run_kind"]["kind"], doc["summary"]["model"]) == (
        "deepspeed-chat",
        kind,
        model,
    )
    if model is not None:
        assert (
            "The model: the reward model (the launch trains a reward model (main.py with --num_padding_at_beginning "
            "1 and --model_name_or_path bigscience/bloomz-560m))."
        ) in out
