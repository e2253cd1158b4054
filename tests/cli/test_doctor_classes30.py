"""Issue 41, round 30: readings the round-29 re-check still graded wrong, on crafted input of each class; each
positive test fails on b39bfd5."""

import pytest

from nanscope.cli.main import main
from nanscope.facts import wordings
from nanscope.launch import line_steps
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. a step printed rounded (baselines' logger, '%-8.3g': 153021 as `1.53e+05`) is said as printed, never as an exact
# number (holdout25 04)
def _table(step: str, start: str = "Logging to /tmp/openai-2021-01-01\n") -> str:
    return (
        start + "-----------------------------\n"
        "| lg_loss_scale | 12.5      |\n"
        "| loss          | nan       |\n"
        "| mse           | nan       |\n"
        f"| step          | {step:<9} |\n"
        "-----------------------------\n"
    )


def test_1_a_rounded_step_is_said_as_printed(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _table("1.53e+05"))
    assert (doc["summary"]["step"], doc["summary"]["step_printed"]) == (153000, "1.53e+05")
    assert "The first non-finite metric: loss at step 1.53e+05 (line 4, the step printed rounded: about 153000)" in out
    assert "step 153000 (the line, printed 1.53e+05: rounded, so not exact)" in out


def test_1_an_exact_step_is_said_exactly(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _table("153021"))
    assert (doc["summary"]["step"], doc["summary"]["step_printed"]) == (153021, None)
    assert "The first non-finite metric: loss at step 153021 (line 4)" in out


def test_1_a_table_that_starts_the_input_is_at_or_before_its_step(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, _table("1.53e+05", start=""))
    assert (
        "loss at or before step 1.53e+05 (line 3: the input's first record of loss, so an earlier step may have been "
        "non-finite too; the step printed rounded: about 153000)"
    ) in out


@pytest.mark.parametrize(
    ("value", "printed"),
    [("1.53e+05", "1.53e+05"), ("1e+03", "1e+03"), ("'2.0E+04'", "2.0e+04"), ("1.5e+01", None), ("153021", None),
     ("1.2345e+03", None), ("nan", None)],
)  # fmt: skip
def test_1_which_printed_steps_are_rounded(value, printed):
    assert line_steps.rounded(value) == printed


# 2. Megatron's grad-norm assertion through a frame of grad_buffer.py is a Megatron-LM main between core 0.5.0 and 0.6.0,
# in no release (holdout19 09): core_v0.5.0's grad_buffer.py has no such check, 0.6.0 renamed the file
_ASSERT = (
    "Traceback (most recent call last):\n"
    '  File "/w/Megatron-LM/megatron/core/distributed/{file}", line 146, in finish_grad_sync\n'
    "AssertionError: Rank 5: found NaN in local grad norm in backward pass before data-parallel communication "
    "collective. Device: 5, node: node-3\n"
)


def test_2_a_grad_buffer_frame_under_the_assertion_is_a_main_of_no_release(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ASSERT.format(file="grad_buffer.py"))
    assert doc["failure"]["megatron_core"] is None
    assert doc["failure"]["megatron_lm_main"] == wordings.GRAD_BUFFER_MAIN
    assert doc["frame_evidence"]["megatron_core"] == []
    assert (
        "Rank 5 found NaN in its local gradient norm before the data-parallel reduce (grad_buffer.py's assertion, in no "
        "release)"
    ) in out
    assert "check_grads" not in out  # a function of core 0.12 on
    assert "the check reached: grad_buffer.py's DDP bucket check (finish_grad_sync)" in out
    assert "core 0.6 to 0.9" not in out and "megatron-core: 0.6.0" not in out


def test_2_the_renamed_file_keeps_its_releases(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ASSERT.format(file="param_and_grad_buffer.py"))
    assert doc["failure"]["megatron_core"]["first"] == "0.6.0"
    assert doc["failure"]["megatron_lm_main"] is None
    assert "(core 0.6 to 0.9's assertion)" in out


# 3. --load beside a log whose first Megatron iteration is 1 resumed no training checkpoint (holdout19 06): Megatron
# resumes at the iteration after the saved one (checkpointing.py:1600-1610), and with no tracker file starts from
# random (:1088-1100)
_SCRIPT = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 24 --hidden-size 2048 "
    "--num-attention-heads 16 --micro-batch-size 4 --global-batch-size 32 --seq-length 2048 --train-iters 2500 "
    "--save ./ckpt --load ./ckpt --fp16 --lr 3e-4\n"
)
_ITERATION = (" iteration {n:>8}/    2500 | consumed samples: {s:>12} | lm loss: {loss} | loss scale: 1.0 | "
              "grad norm: 2.265 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")  # fmt: skip


def _log(first: int) -> str:
    return _ITERATION.format(n=first, s=32 * first, loss="1.065542E+01") + _ITERATION.format(
        n=first + 1, s=32 * first + 32, loss="nan"
    )


def test_3_load_beside_a_first_iteration_of_1_resumed_nothing(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _log(1), _SCRIPT)
    checkpoint = next(c for c in doc["candidates"] if c["id"] == "bad-checkpoint-resume")
    assert checkpoint["status"] == "undecidable"
    assert checkpoint["evidence"][0].startswith(
        "--load ./ckpt (--save's directory too: a first run finds nothing there), but the log's first iteration line "
        "(line 1) is iteration 1: Megatron resumes a checkpoint at the iteration after the one it saved, so none was "
        "resumed"
    )
    assert "bad-checkpoint-resume enabled" not in out


def test_3_load_beside_a_later_first_iteration_is_a_resume(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _log(1001), _SCRIPT)
    checkpoint = next(c for c in doc["candidates"] if c["id"] == "bad-checkpoint-resume")
    assert checkpoint["status"] == "enabled"


# 4. rsl-rl's first block in the input is where the text starts: its iteration is "at or before" (holdout25 09)
_BLOCK = (
    "################################################################################\n"
    "                      Learning iteration {n}/50000\n"
    "\n"
    "          Mean value_function loss: {value}\n"
    "               Mean surrogate loss: {value}\n"
    "                 Mean entropy loss: 17.0273\n"
)


def test_4_the_input_s_first_block_is_at_or_before_its_iteration(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _BLOCK.format(n=17, value="nan"))
    assert doc["summary"]["step"] == 17
    assert "Mean value_function loss at or before step 17 (line 4: the input's first record of" in out


def test_4_a_later_block_is_at_its_iteration(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _BLOCK.format(n=16, value="0.5") + _BLOCK.format(n=17, value="nan"))
    assert doc["summary"]["step"] == 17
    assert "at or before" not in out


# 5. NeMo 0.x's logger prefix from a module only it has (nemo/backends/pytorch/actions.py) names it (holdout13 10), and
# its `Loss is NaN or inf.` is said whole
def test_5_nemo_0_s_module_names_it(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "[NeMo W 2020-09-26 17:52:50 actions:1479] Loss is NaN or inf.\n")
    assert doc["framework"]["name"] == "nemo-0.x"
    assert doc["failure"]["message"] == "Loss is NaN or inf"
    assert "moe-aux-loss" not in out  # a job without megatron-core


def test_5_nemo_s_own_modules_stay_nemo(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "[NeMo W 2024-03-01 10:00:00 nemo_logging:349] Loss is NaN or inf.\n")
    assert doc["framework"]["name"] == "nemo"


# 6. a script of several training commands: the last is read, and the verdict says so (holdout12 19: an SFT command,
# then a reward model's, each "success")
_STAGE = "CUDA_VISIBLE_DEVICES=0,3 accelerate launch src/train_bash.py --stage {stage} --do_train --bf16\n"


def test_6_several_commands_are_said_and_the_last_is_read(tmp_path, capsys):
    script = "# sft\n" + _STAGE.format(stage="sft") + "\n# rm\n" + _STAGE.format(stage="rm")
    (tmp_path / "train.sh").write_text(script)
    assert main(["doctor", str(tmp_path / "train.sh")]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert (
        "The launch script runs 2 Python scripts or modules (line 2: src/train_bash.py, line 5: src/train_bash.py): the "
        "last met, line 5, is read as the run's command."
    ) in out


def test_6_one_command_says_nothing_of_others(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, "{'loss': nan, 'epoch': 0.1}\n", _STAGE.format(stage="sft"))
    assert "Python scripts or modules" not in out


# 7. Megatron-Bridge's performance launcher: its short flags, a node's GPUs by GPU type, and the parallel sizes its
# recipe sets, not read (holdout12 10, holdout14 05): no layout of Megatron's defaults in their place
_BRIDGE = "python3 scripts/performance/setup_experiment.py -g gb200 -m llama31 -mr llama31_405b -gn 4 -ng 128 {more}\n"


def test_7_a_bridge_recipe_s_sizes_are_not_megatron_s_defaults(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "{'loss': nan}\n", _BRIDGE.format(more="-c nvfp4"))
    assert doc["topology"] is None
    assert (
        "no megatron-core layout: its recipe sets TP, PP, CP, EP, not read here, so nemo's ranks are not placed; world "
        "128 = 32 nodes x 4 GPUs"
    ) in out
    fp8 = next(c for c in doc["candidates"] if c["id"] == "fp8-fp4-recipe")
    assert (fp8["status"], fp8["evidence"][0]) == (
        "enabled",
        "-c nvfp4: Megatron-Bridge's nvfp4 compute precision (NVIDIA-NeMo/Megatron-Bridge 067f987 "
        "scripts/performance/argument_parser.py:695)",
    )
    cp = next(c for c in doc["candidates"] if c["id"] == "cp-rank-all-masked")
    assert cp["status"] == "undecidable"  # not "CP 1": the recipe's CP is not read


def test_7_a_node_s_gpus_by_the_gpu_type_where_not_given(tmp_path, capsys):
    script = "python3 scripts/performance/setup_experiment.py -g h100 -m llama3 -ng 64 -tp 2 -pp 4 -cp 1 -ep 1\n"
    doc, out = _doctor(tmp_path, capsys, "{'loss': nan}\n", script)
    assert (doc["topology"]["world"], doc["topology"]["gpus_per_node"], doc["topology"]["tp"]) == (64, 8, 2)
    assert "its recipe sets" not in out


# 8. a step a line named before a later progress bar is not the later dict's step (holdout20 08: a bar with
# `[+] Step 100 -> save_step_100.zip uploaded` glued, bars on to 135/300, then a dict with grad_norm nan)
_GRPO = "{{'loss': 0.0, 'grad_norm': {norm}, 'reward': 1.2, 'reward_std': 0.3, 'kl': {kl}, 'epoch': 0.05}}\n"


def test_8_a_bar_after_a_named_step_gives_the_dict_s_step(tmp_path, capsys):
    log = (
        _GRPO.format(norm=0.15, kl="nan")
        + "  1% 3/300 [01:33<2:24:37, 29.22s/it]\n"
        + _GRPO.format(norm=0.14, kl=0.01)
        + " 33% 100/300 [40:51<1:14:48, 22.44s/it][+] Step 100 -> save_step_100.zip uploaded.\n"
        + _GRPO.format(norm=0.14, kl=0.01)
        + " 45% 135/300 [54:58<59:08, 21.50s/it]\n"
        + "==================================================\n"
        + _GRPO.format(norm="nan", kl="nan")
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["graver_nonfinite"]["after_step"] == 135
    assert "went non-finite later: grad_norm after step 135 (line 8)" in out


# 9. lines only one stack prints name it: DeepSpeed-Chat's epoch-mean loss (holdout19 03), mlx-lm's report line
# (holdout23 10)
@pytest.mark.parametrize(
    ("log", "name"),
    [
        ("Epoch 1/1 with loss inf\n", "deepspeed-chat"),
        ("Iter 10: Val loss nan, Val took 1.2s\nIter 10: Train loss nan, Learning Rate 1.000e-05, It/sec 0.1\n",
         "mlx-lm"),
    ],
)  # fmt: skip
def test_9_a_stack_s_own_line_names_it(log, name, tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == name
    assert "moe-aux-loss" not in out  # both train without megatron-core


def test_9_a_look_alike_names_none(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "Epoch 1/1 with loss inf and more\nIteration 10: Train loss nan\n")
    assert doc["framework"]["name"] == "unknown"


# 10. an anomaly-mode warning glued after a progress bar the terminal cut before its `]` takes that bar's step
# (holdout25 08: `20%|▏| 9929/50000 [1:55:09<10:34:44,  1.05i/opt/.../__init__.py:175: UserWarning: Error detected`)
_ANOMALY = (
    "{bars}/opt/conda/lib/python3.7/site-packages/torch/autograd/__init__.py:175: UserWarning: Error detected in "
    "PowBackward0. Traceback of forward call that caused the error:\n"
    '  File "train.py", line 15, in <lambda>\n'
    "    img2mse = lambda x, y : torch.mean((x - y) ** 2)\n"
)


def test_10_a_cut_bar_before_an_anomaly_warning_gives_its_step(tmp_path, capsys):
    bars = " 20%|▏| 9928/50000 [1:55:09<13:11:34 20%|▏| 9929/50000 [1:55:09<10:34:44,  1.05i"
    doc, out = _doctor(tmp_path, capsys, _ANOMALY.format(bars=bars))
    assert doc["summary"]["step"] == 9929
    assert "at step 9929 (the progress bar on its line, 9929/50000)" in out
    assert doc["summary"]["points_to"].endswith("the error line after them (where the text has it) says which")


def test_10_no_bar_no_step(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _ANOMALY.format(bars=""))
    assert doc["summary"]["step"] is None


def test_7_a_bridge_bf16_compute_rules_fp8_out(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "{'loss': nan}\n", _BRIDGE.format(more="--compute_dtype bf16"))
    fp8 = next(c for c in doc["candidates"] if c["id"] == "fp8-fp4-recipe")
    assert fp8["status"] == "ruled-out"
    assert fp8["evidence"][0].startswith(
        "--compute_dtype bf16: Megatron-Bridge's bf16 compute precision, no fp8 or fp4"
    )


# 11. another stack's evidence line (a NeMo 0.x `Loss is NaN or inf.`) is no Megatron check: no explanation calls it
# "a validate_result call of the job's own code" (holdout13 14, 13 18; 84 of the holdout JSON documents said so)
def test_11_an_evidence_line_is_not_explained_as_megatron_s_check(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "[NeMo W 2020-09-26 17:52:50 actions:1479] Loss is NaN or inf.\n")
    assert not any("validate_result" in line for line in doc["explanations"])


# 12. an empty placeholder `--train_dataset=<>` is a value the poster left out, not bash's `<>` redirection, which
# swallowed the flags after it (holdout13 10: `--batch_size=42` lost)
def test_12_an_empty_placeholder_keeps_the_flags_after_it(tmp_path, capsys):
    script = "python speech2text.py --amp_opt_level=O2 --eval_datasets=<>  --batch_size=42  --train_dataset=<>\n"
    _, out = _doctor(tmp_path, capsys, "[NeMo W 2020-09-26 17:52:50 actions:1479] Loss is NaN or inf.\n", script)
    assert "--batch_size=42" in out and "--train_dataset=<>" in out
    assert "`<>` read as value(s) the poster left out" in out


# 13. a fault in the model under another stack: the flags it gives that switch the mechanism on are said (holdout21 02:
# `--moe_aux_loss_coeff 1e-3` was "no flag enables or excludes it"; holdout19 06: `--fp16`)
def test_13_given_model_flags_are_said(tmp_path, capsys):
    script = ("NPROC_PER_NODE=8 megatron sft --model m --expert_model_parallel_size 8 --moe_aux_loss_coeff 1e-3 "
              "--moe_grouped_gemm true --fp16 true\n")  # fmt: skip
    log = "[rank13]: RuntimeError: Rank 13, node n1, device 5, iteration 1: Unexpected result nan (message='found NaN "
    log += "in local grad norm for bucket #0 in backward pass before data-parallel communication collective')\n"
    doc, _ = _doctor(tmp_path, capsys, log, script)
    evidence = {c["id"]: c["evidence"][0] for c in doc["candidates"]}
    assert evidence["moe-aux-loss"] == (
        "--moe_aux_loss_coeff 1e-3: given, which switches on what this cause needs; no flag says whether it fired"
    )
    assert (
        evidence["activation-overflow"]
        == "--fp16 true: an activation past 65504 is inf in fp16; no flag says whether one was"
    )


def test_13_a_zero_coefficient_is_not_given(tmp_path, capsys):
    script = "NPROC_PER_NODE=8 megatron sft --model m --moe_aux_loss_coeff 0\n"
    doc, _ = _doctor(tmp_path, capsys, "{'loss': nan, 'grad_norm': nan}\n", script)
    assert not any("given, which switches" in " ".join(c["evidence"]) for c in doc["candidates"])


# 14. a log's own line that it loaded weights or a checkpoint is said for bad-checkpoint-resume (holdout20 08:
# `Adapter weights loaded — stage-1 weights restored`); transformers' `Loading checkpoint shards` is a model's
# pretrained weights, not one
def test_14_a_logged_load_is_said(tmp_path, capsys):
    log = "[+] Adapter weights loaded, stage-1 weights restored, continuing from step 100.\n{'loss': nan, 'epoch': 1}\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    checkpoint = next(c for c in doc["candidates"] if c["id"] == "bad-checkpoint-resume")
    assert checkpoint["evidence"][0] == (
        "the log says the run loaded one at line 1: `[+] Adapter weights loaded, stage-1 weights restored, continuing "
        "from step 100.`"
    )


def test_14_pretrained_shards_are_no_checkpoint_load(tmp_path, capsys):
    log = "Loading checkpoint shards: 100%|####| 2/2 [00:01<00:00,  1.46it/s]\n{'loss': nan, 'epoch': 1}\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    checkpoint = next(c for c in doc["candidates"] if c["id"] == "bad-checkpoint-resume")
    assert checkpoint["evidence"][0] == "no launch script: whether the run loads a checkpoint is unknown"
    assert doc["metrics"]["checkpoint_load_line"] is None


# 15. an evidence line in the words of stacks nanscope does not catalogue names them in the framework line (holdout25
# 04: "framework unknown (nothing ... names a framework)" beside a verdict naming guided-diffusion's trainer)
def test_15_an_uncatalogued_stack_s_words_are_said_in_the_framework_line(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "Found NaN, decreased lg_loss_scale to -3.5\n")
    assert doc["framework"]["name"] == "unknown"
    assert doc["framework"]["how"] == (
        "no framework nanscope catalogues; the log's scaler-overflow line (line 1) is printed by guided-diffusion's fp16 "
        "trainer (improved-diffusion's prints the same words)"
    )


# 16. the observations offered to a job of another stack are its own: no slime metric in bad-checkpoint-resume's, and
# library-regression's rerun is a rerun on two GPUs, which megatron-core's RerunStateMachine is one way to make
def test_16_observations_fit_another_stack(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}\n")
    said = {c["id"]: c["discriminator"] for c in doc["candidates"]}
    assert said["bad-checkpoint-resume"] == (
        "the first step after the load: non-finite (or its gradient norm far out of range) there and not on a fresh "
        "start from the same weights"
    )
    assert said["library-regression"].startswith("the failing step rerun on the same GPU and on another")


# 17. guided-diffusion's lg_loss_scale below -1074: its scale 2 ** lg is 0.0 in a Python float, the gradient norm is
# divided by it, and every step is skipped whatever the gradients (holdout25 04: -16200; fp16_util.py:192-194, :225)
def test_17_a_log2_scale_past_the_least_float_skips_every_step(tmp_path, capsys):
    doc, out = _doctor(
        tmp_path, capsys, _table("1.53e+05").replace("| lg_loss_scale | 12.5      |", "| lg_loss_scale | -1.62e+04 |")
    )
    assert (
        "below -1074 the scale, 2 ** lg_loss_scale in a Python float, is 0.0, and the gradient norm is divided by it: "
        "inf or NaN whatever the gradients, so every step is skipped from then on and the run no longer trains"
    ) in out
    assert "overflow fp16" not in out


def test_17_a_log2_scale_above_it_is_a_scale_below_1(tmp_path, capsys):
    _, out = _doctor(
        tmp_path, capsys, _table("1.53e+05").replace("| lg_loss_scale | 12.5      |", "| lg_loss_scale | -0.821    |")
    )
    assert "a scale below 1 means the gradients hold inf or NaN even unscaled" in out
    assert "below -1074" not in out


# 18. a record that starts the input is "at or before" its step in the candidates' evidence too (holdout25 04)
def test_18_the_candidates_say_at_or_before_too(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _table("1.53e+05", start=""))
    evidence = " ".join(e for c in doc["candidates"] for e in c["evidence"])
    assert "the metrics: loss non-finite first at or before step 1.53e+05:" in evidence


# 19. a launch script whose text ends inside its command's `\` continuation is a cut paste: said, and a parallel size
# it does not give rules nothing out (holdout21 02: "CP 1" ruled cp-rank-all-masked out)
def test_19_a_command_cut_at_the_text_s_end_is_said(tmp_path, capsys):
    script = "NPROC_PER_NODE=8 megatron sft \\\n    --model m \\\n    --tensor_model_parallel_size 2 \\\n"
    doc, out = _doctor(tmp_path, capsys, "{'loss': nan, 'grad_norm': nan}\n", script)
    assert (
        "The launch script's train command is cut short: line 3: the text ends inside the command's `\\` "
        "continuation: the paste is cut there, and what followed it is not read."
    ) in out
    cp = next(c for c in doc["candidates"] if c["id"] == "cp-rank-all-masked")
    assert cp["status"] == "undecidable"


def test_19_a_whole_command_is_not_cut(tmp_path, capsys):
    script = "NPROC_PER_NODE=8 megatron sft \\\n    --model m \\\n    --tensor_model_parallel_size 2\n"
    _, out = _doctor(tmp_path, capsys, "{'loss': nan, 'grad_norm': nan}\n", script)
    assert "cut short" not in out


# 20. the grad_buffer.py frame is a known one (its own release and meaning), its assertion's source the JSON's, and no
# rerun verdict is expected of it (holdout19 09)
def test_20_the_grad_buffer_frame_is_known(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ASSERT.format(file="grad_buffer.py"))
    assert "unknown frame" not in out
    assert doc["failure"]["message_source"] == f"{wordings.GRAD_BUFFER} ({wordings.GRAD_BUFFER_MAIN})"
    assert "rerun verdict: none in the input (Megatron's assertion comes before the RerunStateMachine" in out


# 21. apex amp's opt levels O1-O3 run in fp16 (holdout13 10: `--amp_opt_level=O2`)
def test_21_apex_amp_is_fp16(tmp_path, capsys):
    script = "python speech2text.py --amp_opt_level=O2 --batch_size=42\n"
    doc, _ = _doctor(tmp_path, capsys, "[NeMo W 2020-09-26 17:52:50 actions:1479] Loss is NaN or inf.\n", script)
    activation = next(c for c in doc["candidates"] if c["id"] == "activation-overflow")
    assert activation["evidence"][0] == (
        "--amp_opt_level=O2: an activation past 65504 is inf in fp16; no flag says whether one was"
    )
