"""Issue 41, round 4: the classes of misreading found on a fourth set of reports doctor had never read, each on crafted
input of its class in the stack's own format (never a report's string): a readable benign log refused (a), ...
Each test fails on round 3's doctor."""

import json

import pytest

from nanscope.cli.main import main

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(tmp_path, capsys, log: str, *args: str) -> tuple[dict, str]:
    (tmp_path / "job.log").write_text(log)
    out = tmp_path / "d.json"
    code = main(["doctor", "--traceback", str(tmp_path / "job.log"), *args, "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), " ".join(captured.out.replace("│", " ").split())


# a. a readable benign log is read: exit 0, "no non-finite value and no error found in N lines (what was read)"

# transformers' Trainer: its `log` dict, then the tqdm bar (transformers trainer.py `_maybe_log_save_evaluate`)
_HF = (
    "***** Running training *****\n  Num examples = 1,000\n  Num Epochs = 1\n"
    "{'loss': 2.3412, 'grad_norm': 1.2345, 'learning_rate': 4.9e-05, 'epoch': 0.05}\n"
    "  5%|▌         | 10/200 [00:10<03:10,  1.00s/it]\n"
    "{'loss': 2.1003, 'grad_norm': 1.1021, 'learning_rate': 4.8e-05, 'epoch': 0.1}\n"
    " 10%|█         | 20/200 [00:20<03:00,  1.00s/it]\n"
    "{'train_runtime': 200.1, 'train_samples_per_second': 8.0, 'train_steps_per_second': 1.0, 'train_loss': 2.0, "
    "'epoch': 1.0}\n"
    "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
)
# Megatron-LM's training_log line (megatron/training/training.py), all finite
_MEGATRON = "".join(
    f" [2024-05-01 10:00:{i:02d}] iteration       {i}/    1000 | consumed samples:        {64 * i} | elapsed time per "
    f"iteration (ms): 1234.5 | learning rate: 1.000000E-05 | global batch size:    64 | lm loss: 9.8{i}E+00 | loss "
    "scale: 1.0 | grad norm: 2.345 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    for i in range(10, 13)
)
# a DeepSpeed engine's step report (deepspeed/runtime/engine.py), finite
_DEEPSPEED = (
    "[2024-05-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[1e-05], "
    "mom=[(0.9, 0.999)]\n"
    "[2024-05-01 10:00:01,123] [INFO] [timer.py:260:stop] epoch=0/micro_step=20/global_step=20, "
    "RunningAvgSamplesPerSec=12.3, CurrSamplesPerSec=12.1, MemAllocated=3.2GB, MaxMemAllocated=5.1GB\n"
)
_PLAIN = "Loading checkpoint shards: done\nSaving model checkpoint to /out/checkpoint-200\nTraining finished.\n"


@pytest.mark.parametrize(
    ("log", "lines", "read"),
    [
        (_HF, 9, "the metric lines of transformers, up to step 20"),
        (_MEGATRON, 3, "the metric lines of megatron-lm, up to step 12"),
        (_PLAIN, 3, "plain lines, no metric line"),
    ],
    ids=["transformers", "megatron", "ends-normally"],
)
def test_a_benign_log_is_read_not_refused(log, lines, read, tmp_path, capsys):
    """Round 3: the plain log exited 2 "no Megatron error found"; the metric logs said "every value the text prints
    is finite", without how much was read."""
    doc, out = _doctor(tmp_path, capsys, log)
    said = f"no non-finite value and no error found in {lines} lines (what was read: {read})"
    assert doc["summary"]["benign"] == said and said in out
    assert doc["summary"]["kind"] is None and doc["failure"]["rank"] is None


def test_a_benign_deepspeed_log_is_not_refused(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _DEEPSPEED)
    assert doc["summary"]["benign"].startswith("no non-finite value and no error found in 2 lines (what was read: ")
    assert doc["summary"]["kind"] is None


def test_a_plain_log_does_not_claim_metric_lines(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, _PLAIN)
    assert "No error line in the log names a NaN or an Inf, and it has no metric line." in out
    assert "only its metric lines say" not in out


@pytest.mark.parametrize(
    "content",
    [b"", b"   \n\n", bytes(range(256)) * 64, b"\0" * 4096, b"import torch\ndef train():\n    pass\n"],
    ids=["empty", "blank", "binary", "nul-bytes", "python-source"],
)
def test_a_what_is_no_log_is_still_refused(content, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    assert main(["doctor", "--traceback", str(path)]) == 2
    assert "no Megatron error found" in capsys.readouterr().err


def test_a_long_line_of_text_is_read_in_bounded_time(tmp_path, capsys):
    """A hang check, not a speed one: 8 MB of one benign line and 200k short lines finish (bound: pytest-timeout)."""
    doc, _ = _doctor(tmp_path, capsys, "x=" + "ab " * 3_000_000 + "\n" + "step ok\n" * 200_000)
    assert doc["summary"]["benign"].startswith("no non-finite value and no error found in 200001 lines")


# b. DeepSpeed's loss-scaler line without its `[deepspeed] OVERFLOW!` head (a logger's own prefix, a timestamp, none)


@pytest.mark.parametrize(
    "line",
    [
        "Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "2024-05-01 10:00:01,123 - INFO - Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "[2024-05-01 10:00:01,123] [INFO] [loss_scaler.py:183:update_scale] Rank 0 Skipping step. Attempted loss "
        "scale: 65536, reducing to 32768",
    ],
    ids=["bare", "logger", "deepspeed-logger"],
)
def test_b_a_headless_deepspeed_skip_line_is_overflow_evidence(line, tmp_path, capsys):
    """Round 3: no finding (the line was not read: its anchor was `OVERFLOW!`)."""
    doc, _ = _doctor(tmp_path, capsys, "loading data\n" + line + "\n")
    assert (doc["failure"]["check"], doc["failure"]["line"], doc["failure"]["message"]) == (
        "deepspeed-overflow",
        2,
        "loss scale 65536 -> 32768",
    )
    assert doc["failure"]["other_ranks"] == ["rank 0 logs it (DeepSpeed prints it on rank 0 only)"]


def test_b_a_long_line_of_rank_words_is_read_in_bounded_time(tmp_path, capsys):
    """A hang check (bound: pytest-timeout): the anchor repeated on one long line, never completed."""
    doc, _ = _doctor(tmp_path, capsys, "Rank 1 Skipping step. Attempted loss scale" * 40_000 + "\n")
    assert doc["summary"]["kind"] is not None or doc["summary"]["benign"] is not None


# c. an unnamed printed tensor (torch/_tensor_str.py's repr) holding nan or inf


@pytest.mark.parametrize(
    ("line", "kind", "values"),
    [
        ("tensor(nan)", "NaN", "nan"),
        ("tensor(nan, device='cuda:0', grad_fn=<NllLossBackward0>)", "NaN", "nan"),
        ("tensor([nan, nan], device='cuda:0')", "NaN", "nan, nan"),
        ("[rank3]: tensor([[1.0000, inf],", "Inf", "1.0000, inf"),
    ],
    ids=["scalar", "device-grad-fn", "vector", "rank-prefixed-cut"],
)
def test_c_a_printed_tensor_is_a_nonfinite_value(line, kind, values, tmp_path, capsys):
    """Round 3: "no Megatron error found" (exit 2), or every value finite."""
    doc, out = _doctor(tmp_path, capsys, "epoch 0 done\n" + line + "\n")
    assert (doc["failure"]["check"], doc["failure"]["line"], doc["summary"]["kind"]) == ("printed-tensor", 2, kind)
    assert doc["failure"]["message"] == f"its values {values}"
    assert f"a printed tensor holds nan or inf (line 2; its values {values})" in out.lower()
    assert doc["summary"]["rank"] == (3 if line.startswith("[rank3]") else None)


@pytest.mark.parametrize("line", ["tensor(1.2345, device='cuda:0')", "tensor([0.5, 1.5])", "loss: tensor(2.1)"])
def test_c_a_finite_printed_tensor_is_no_evidence(line, tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, line + "\n")
    assert doc["summary"]["kind"] is None and doc["summary"]["benign"] is not None


def test_c_a_named_tensor_stays_the_metric_it_names(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "loss tensor(nan, device='cuda:0')\n")
    assert (doc["summary"]["metric"], doc["summary"]["kind"]) == ("loss", "NaN")


def test_c_a_long_tensor_line_is_read_in_bounded_time(tmp_path, capsys):
    """A hang check (bound: pytest-timeout): tensor( repeated, never closed, on one long line."""
    doc, _ = _doctor(tmp_path, capsys, "tensor([" * 200_000 + "\n")
    assert doc["summary"]["kind"] is None


# g. a blank or spaces-only line inside a `\` continuation ends the command, as bash does (checked: `printf 'echo a
# \\\n   \n   echo b\n' | bash` prints a, then b), said in one line; the flags before it are read


def _script(tmp_path, capsys, text: str) -> dict:
    (tmp_path / "run.sh").write_text(text)
    out = tmp_path / "s.json"
    assert main(["doctor", str(tmp_path / "run.sh"), "--json", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


@pytest.mark.parametrize(("blank", "what"), [("    ", "a line of spaces only"), ("", "a blank line")])
def test_g_a_blank_line_in_a_continuation_cuts_the_command_and_says_so(blank, what, tmp_path, capsys):
    """Round 3: the command was cut there without a word."""
    text = (
        "#!/bin/bash\npython3 -m verl.trainer.main_ppo \\\n    algorithm.adv_estimator=grpo \\\n    trainer.nnodes=1 \\\n"
        f"{blank}\n    trainer.n_gpus_per_node=7 \\\n    trainer.total_epochs=3\n"
    )
    doc = _script(tmp_path, capsys, text)
    cut = (
        f"line 5: {what} inside the command's `\\` continuation ends the command there, as bash does: line 6 on "
        "(`trainer.n_gpus_per_node=7` ...) is not its arguments, and what those lines set is not read"
    )
    assert cut in doc["notes"] and f"The launch script's train command is cut short: {cut}." in doc["verdict"]
    assert doc["inputs"]["argv"] == ["algorithm.adv_estimator=grpo", "trainer.nnodes=1"]


def test_g_a_continuation_followed_by_many_blank_lines_is_read_in_bounded_time(tmp_path, capsys):
    """A hang check (bound: pytest-timeout): 100k blank-ish lines after a `\\`, no indented line after them."""
    doc = _script(tmp_path, capsys, "python3 -m verl.trainer.main_ppo \\\n" + " \n#\n" * 100_000 + "x\n")
    assert doc["inputs"]["argv"] == []


# h. a transformers Trainer dict is its bar's step: on_step_end updates the bar to global_step, then on_log prints the
# dict with tqdm.write and the bar is redrawn at the same count (launch.metric_lines._trainer_dict cites the source)
_BAR9 = "  4%|▍         | 9/200 [00:09<03:11,  1.00s/it]"
_BAR10 = "  5%|▌         | 10/200 [00:10<03:10,  1.00s/it]"
_BAR11 = "  6%|▌         | 11/200 [00:11<03:09,  1.00s/it]"
_DICT = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.05}"


@pytest.mark.parametrize(
    "log",
    [
        f"{_BAR9}\n{_DICT}\n{_BAR10}\n{_BAR11}\n",  # a lagging bar before it, the redrawn one after
        f"{_BAR9}\n{_DICT}\n\n{_BAR10}\n",  # a blank line between
        f"{_DICT}\n{_BAR10}\n",  # the dict first
    ],
    ids=["bar-before-lags", "blank-between", "dict-first"],
)
def test_h_a_trainer_dict_is_its_bars_step(log, tmp_path, capsys):
    """Round 3: step 9 (the lagging bar on the line before it), not the bar redrawn after it."""
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["metric"], doc["summary"]["kind"], doc["summary"]["step"]) == ("loss", "NaN", 10)


# e. a launch command quoted in Markdown (a pasted report given as the script): fences, `> ` quotes, `$ ` prompts

_COMMAND = (
    "torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py \\\n    --tensor-model-parallel-size 2 \\\n"
    "    --pipeline-model-parallel-size 2 \\\n    --fp16\n"
)


@pytest.mark.parametrize(
    ("text", "how"),
    [
        ("My run dies with NaN. The command:\n\n```bash\n" + _COMMAND + "```\nThen it fails.\n", "its ``` fences"),
        ("Command:\n" + "".join("> " + line + "\n" for line in _COMMAND.splitlines()), "its `> ` quotes"),
        ("I ran\n$ " + _COMMAND + "and got NaN\n", "its `$ ` prompts"),
        ("```\n$ " + _COMMAND + "```\n", "its ``` fences, its `$ ` prompts"),
    ],
    ids=["fence", "quote", "prompt", "fence-and-prompt"],
)
def test_e_a_markdown_quoted_command_is_the_launch(text, how, tmp_path, capsys):
    """Round 3: exit 2, "no train command found"."""
    doc = _script(tmp_path, capsys, text)
    assert doc["inputs"]["argv"] == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                     "--fp16"]  # fmt: skip
    assert (doc["topology"]["world"], doc["topology"]["tp"], doc["topology"]["pp"]) == (8, 2, 2)
    said = f"{tmp_path / 'run.sh'}: read as a Markdown paste: the command lines inside {how}, the rest not read"
    assert said in doc["notes"]


def test_e_a_plain_script_is_not_read_as_markdown(tmp_path, capsys):
    doc = _script(tmp_path, capsys, "#!/bin/bash\n" + _COMMAND)
    assert not any("Markdown" in note for note in doc["notes"])


# f. a Slurm wrapper: `srun ... bash -c "torchrun ..."`, #SBATCH's layout, `python -m torch.distributed.run`


def test_f_srun_bash_c_is_read_as_the_launch_with_sbatchs_layout(tmp_path, capsys):
    """Round 3: exit 2, "no train command found"."""
    text = (
        "#!/bin/bash\n#SBATCH --job-name=gpt\n#SBATCH --nodes=4\n#SBATCH --gpus-per-node=8\n"
        'srun --ntasks-per-node=1 bash -c "torchrun --nnodes \\$SLURM_NNODES --nproc_per_node \\$SLURM_GPUS_PER_NODE '
        'pretrain_gpt.py --tensor-model-parallel-size 4 --fp16"\n'
    )
    doc = _script(tmp_path, capsys, text)
    topology = doc["topology"]
    assert (doc["inputs"]["train_script"], doc["inputs"]["train_command_line"]) == ("pretrain_gpt.py", 5)
    assert (topology["world"], topology["nodes"], topology["gpus_per_node"], topology["tp"]) == (32, 4, 8, 4)
    assert "line 5: the string its `bash -c` runs read as the launch command" in doc["notes"]
    assert "#SBATCH --nodes 4: SLURM_NNODES=4, as Slurm sets it for the job" in doc["notes"]


def test_f_python_m_torch_distributed_run_lays_out_from_its_flags(tmp_path, capsys):
    text = (
        "python -m torch.distributed.run --nnodes 2 --nproc_per_node 4 pretrain_gpt.py --tensor-model-parallel-size 2\n"
    )
    doc = _script(tmp_path, capsys, text)
    assert (doc["topology"]["world"], doc["topology"]["nodes"], doc["topology"]["gpus_per_node"]) == (8, 2, 4)


def test_f_an_env_value_wins_over_sbatch(tmp_path, capsys):
    (tmp_path / "run.sh").write_text(
        "#SBATCH --nodes=4\nsrun bash -lc 'torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 pretrain_gpt.py'\n"
    )
    out = tmp_path / "s.json"
    assert main(["doctor", str(tmp_path / "run.sh"), "--env", "SLURM_NNODES=2", "--json", str(out)]) == 0
    capsys.readouterr()
    assert json.loads(out.read_text())["topology"]["world"] == 16
