"""Issue 41, round 2: the classes of misreading found on 23 reports doctor had never read, each on crafted input of
its class (never the report's own string): wrapped Megatron records (a), a cut first line (b), steps from bars and
mmengine (c), a progress bar's running mean and a calibrating loss scaler (d), column tables (e), other stacks'
launch commands (f), template words (g), whose words an evidence line is (h), anomaly mode's cut tail (i), a missing
lm loss as the weak evidence it is (j). Each test fails on round 1's doctor."""

import json

import pytest

from nanscope.cli.main import main

FIELDS = ("rank", "kind", "check", "step", "model", "metric")
MEGATRON_CAUSES = ("moe-aux-loss", "moe-zero-token-expert", "moe-router-logits", "grad-reduce-overlap-race",
                   "cpu-offloaded-optimizer", "cp-rank-all-masked", "non-flash-attention-mask-pp",
                   "sp-new-architecture", "fp8-fp4-recipe")  # fmt: skip


pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(tmp_path, capsys, log: str | None = None, script: str | None = None) -> dict:
    argv = ["doctor"]
    if script is not None:
        (tmp_path / "run.sh").write_text(script)
        argv.append(str(tmp_path / "run.sh"))
    if log is not None:
        (tmp_path / "job.log").write_text(log)
        argv += ["--traceback", str(tmp_path / "job.log")]
    out = tmp_path / "d.json"
    assert main([*argv, "--json", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return json.loads(out.read_text())


def _summary(doc: dict) -> dict:
    return {key: doc["summary"][key] for key in FIELDS}


def _iteration(step: int, grad: str, loss: str | None = "2.1E+00", skipped: int = 0) -> list[str]:
    """A Megatron-LM training_log line's fields, in its order."""
    fields = [
        f"iteration {step:8d}/   10000",
        f"consumed samples: {step * 64:12d}",
        "elapsed time per iteration (ms): 812.4",
        "learning rate: 3.0E-04",
        "global batch size:    64",
    ]
    fields += [f"lm loss: {loss}"] if loss is not None else []
    fields += ["loss scale: 1.0"] + ([f"grad norm: {grad}"] if grad else [])
    return fields + [f"number of skipped iterations: {skipped:3d}", "number of nan iterations:   0"]  # fmt: skip


# a. wrapped lines


@pytest.mark.parametrize("width", [2, 3])
def test_a_megatron_record_wrapped_at_its_bars_is_one_line(width, tmp_path, capsys):
    fields = _iteration(41, "inf", loss=None)
    rows = [" | ".join(fields[i : i + width]) + " |" for i in range(0, len(fields), width)]
    log = " " + " | ".join(_iteration(40, "0.93")) + " |\n" + "\n".join(rows) + "\n\n"
    doc = _doctor(tmp_path, capsys, log)
    assert (_summary(doc)["metric"], _summary(doc)["step"], _summary(doc)["kind"]) == ("grad norm", 41, "Inf")
    assert doc["framework"]["name"] == "megatron-lm"
    assert "after step" not in doc["verdict"]


def test_a_record_hard_wrapped_inside_a_word_is_joined_without_a_space(tmp_path, capsys):
    line = " | ".join(_iteration(7, "nan", loss=None)) + " |"
    at = line.index("grad norm") + 2  # `gr` | `ad norm: nan ...`: the terminal's width fell inside the key
    doc = _doctor(tmp_path, capsys, line[:at] + "\n" + line[at:] + "\n")
    assert (_summary(doc)["metric"], _summary(doc)["step"]) == ("grad norm", 7)


# b. a cut first line


def test_a_first_line_cut_at_its_start_names_no_metric(tmp_path, capsys):
    first = " | ".join(_iteration(300, "nan", loss=None)) + " |"
    cut = first[first.index("norm: nan") - 2 :]  # `m norm: nan | ...`
    log = cut + "\n" + "\n".join(" " + " | ".join(_iteration(step, "nan", loss=None)) + " |" for step in (301, 302))
    doc = _doctor(tmp_path, capsys, log + "\n")
    assert (_summary(doc)["metric"], _summary(doc)["step"]) == ("grad norm", 301)
    assert "at or before step 301" in doc["verdict"]
    assert doc["metrics"]["first_nonfinite"]["cut_first_line"] is not None


# c. steps


def test_mmengine_space_padded_iteration_is_the_step(tmp_path, capsys):
    log = "".join(
        f"2024/01/02 10:0{i}:00 - mmengine - INFO - Iter(train) [ {step:3d}/5000]  lr: 1.0e-04  eta: 1:00:00  "
        f"time: 2.1  data_time: 0.01  memory: 9000  loss: 0.81  grad_norm: {'nan' if step >= 90 else '1.2'}\n"
        for i, step in enumerate((70, 80, 90, 100))
    )
    assert _summary(_doctor(tmp_path, capsys, log))["step"] == 90


def test_a_line_glued_after_a_bar_is_the_next_step_and_the_bars_postfix_its_own(tmp_path, capsys):
    """An overflow printed while step 42 ran sits after the bar's 41/500; the bar's loss=nan postfix at 42/500 is
    step 42's: one step for one event, in the verdict and in the JSON."""
    bar = "Train:   8%|▊         | {n}/500 [00:{n:02d}<01:00,  2.00it/s, loss={loss}]"
    overflow = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {s}, reducing to {h}"
    log = (
        bar.format(n=41, loss="3.2") + overflow.format(s=65536, h=32768) + "\n"
        + bar.format(n=42, loss="nan") + overflow.format(s=32768, h=16384) + "\n"
    )  # fmt: skip
    doc = _doctor(tmp_path, capsys, log)
    assert (_summary(doc)["step"], _summary(doc)["metric"], _summary(doc)["kind"]) == (42, "loss", "NaN")
    assert doc["signals"]["signals"][0]["step"] == 42
    assert doc["metrics"]["first_nonfinite"]["step"] == 42
    assert "step 41" not in doc["verdict"]


# d. a progress bar's running mean; a calibrating scaler


def test_a_bars_running_mean_beside_a_finite_reduced_loss_is_no_failure(tmp_path, capsys):
    log = "".join(
        f"Epoch 0:   1%|          | {n}/9000 [01:00<10:00:00,  4.00s/it, loss=nan, v_num=3, "
        f"reduced_train_loss={3.1 + n / 100:.3f}, gradient_norm=0.870, global_step={n - 1}.0]\n"
        for n in (12, 13)
    )
    doc = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["contradicted"] is not None and doc["summary"]["step"] is None  # no failure, no step
    assert doc["metrics"]["first_nonfinite"]["step"] == 11  # where the bar's NaN starts: global_step=11.0
    assert "not a NaN failure by itself" in doc["verdict"]
    assert "the loss is non-finite" not in doc["verdict"]


def test_a_loss_scale_halving_from_its_start_is_calibration(tmp_path, capsys):
    log = "".join(
        f"[2024-01-01 00:00:0{i},000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
        f"Skipping step. Attempted loss scale: {2 ** (24 - i)}, reducing to {2 ** (23 - i)}\n"
        for i in range(3)
    )
    doc = _doctor(tmp_path, capsys, log)
    assert "calibrating" in doc["verdict"] and "16777216 (2^24)" in doc["verdict"]
    assert doc["signals"]["loss_scale"]["overflows"] == 3


# e. tables


def test_a_notebook_table_is_read_by_column(tmp_path, capsys):
    log = (
        "| Step | Training Loss | Validation Loss | reward | kl |\n|---|---|---|---|---|\n"
        "| 10 | 0.512 | No Log | 0.25 | 0.001 |\n| 20 | 0.498 | No Log | 0.31 | inf |\n"
        "| 30 | 0.488 | 0.61 | 0.33 | inf |\n"
    )
    doc = _doctor(tmp_path, capsys, log)
    assert _summary(doc) == {"rank": None, "kind": "Inf", "check": None, "step": 20, "model": None, "metric": "kl"}
    assert doc["framework"]["name"] == "transformers"


# f. other stacks' launch commands


@pytest.mark.parametrize(
    "command",
    [
        "deepspeed --num_gpus 4 sft.py --model_name_or_path m --deepspeed ds_z2.json --fp16",
        "torchrun --nproc_per_node 4 finetune.py --deepspeed configs/zero3.json --bf16 True",
        "accelerate launch --use_deepspeed --num_processes 4 train_dpo.py --beta 0.1",
    ],
)
def test_a_deepspeed_launch_is_deepspeeds_with_no_megatron_layout(command, tmp_path, capsys):
    doc = _doctor(tmp_path, capsys, script=f"#!/bin/bash\n{command}\n")
    assert doc["framework"]["name"] == "deepspeed"
    assert doc["topology"] is None and doc["megatron_core_evidence"] is None
    assert [c["id"] for c in doc["candidates"] if c["id"] in MEGATRON_CAUSES and c["status"] != "ruled-out"] == []
    assert "1 nodes" not in json.dumps(doc)


def test_an_unknown_launcher_gets_no_invented_layout_and_megatron_flags_get_one(tmp_path, capsys):
    doc = _doctor(tmp_path, capsys, script="torchrun --nproc_per_node 2 my_train.py --lr 1e-4\n")
    assert (doc["framework"]["name"], doc["topology"]) == ("unknown", None)
    assert not [i for i in doc["inferred"] if "8 assumed" in i]
    assert "megatron-core" in doc["verdict"]  # said what is unknown
    doc = _doctor(tmp_path, capsys, script="torchrun --nproc_per_node 2 my_train.py --tensor-model-parallel-size 2\n")
    assert doc["megatron_core_evidence"] is not None and doc["topology"]["tp"] == 2


# g. template words


def test_a_metric_log_alone_is_called_a_log(tmp_path, capsys):
    doc = _doctor(tmp_path, capsys, "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05}\n")
    verdict = doc["verdict"]
    assert "traceback" not in verdict.lower() and "it points to a" not in verdict
    assert verdict.count("(") == verdict.count(")")


# h. whose words


def test_grad_overflow_on_iteration_is_deepspeeds_only_after_its_loggers_prefix(tmp_path, capsys):
    prefix = "[2021-01-26 22:05:35,108] [INFO] [fused_optimizer.py:314:_update_scale] \n"
    doc = _doctor(tmp_path, capsys, prefix + "Grad overflow on iteration 12\n")
    assert (doc["summary"]["check"], doc["summary"]["step"], doc["framework"]["name"]) == (
        "deepspeed-overflow", 12, "deepspeed"
    )  # fmt: skip
    assert "apex" not in doc["verdict"]
    doc = _doctor(tmp_path, capsys, "Grad overflow on iteration 12\n")  # the words alone: DeepSpeed's or apex's
    assert (doc["summary"]["check"], doc["framework"]["name"]) == ("scaler-overflow", "unknown")
    assert doc["signals"]["signals"][0]["printed_by"] == ["deepspeed", "apex"]


def test_a_shared_wording_names_no_framework_alone(tmp_path, capsys):
    line = "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 256.0, reducing to 128.0\n"
    doc = _doctor(tmp_path, capsys, line)
    assert doc["framework"]["name"] == "unknown"  # DeepSpeed 0.3's ZeRO and ColossalAI 0.0.x's copy print it
    assert doc["signals"]["signals"][0]["printed_by"] == ["deepspeed", "colossalai"]


def test_every_wording_cites_the_code_that_prints_it():
    from nanscope.facts.signals import WORDINGS  # round 2's table (imported here: the module imports on round 1)

    for wording in WORDINGS:
        assert ".py:" in wording.source and wording.printed_by, wording.id


# i. anomaly mode's cut tail


def test_anomaly_modes_tail_without_its_header_is_anomaly_evidence(tmp_path, capsys):
    log = (
        "    return torch.log1p(probs)\n"
        " (Triggered internally at ../torch/csrc/autograd/python_anomaly_mode.cpp:104.)\n"
        "  Variable._execution_engine.run_backward(\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 9, in <module>\n    loss.backward()\n'
    )
    doc = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["check"], doc["summary"]["op"], doc["summary"]["kind"]) == ("anomaly-forward", "log1p", None)


# j. a missing lm loss


def test_a_skip_and_its_warning_outrank_a_missing_loss(tmp_path, capsys):
    log = (
        " " + " | ".join(_iteration(900, "1.04", loss=None)) + " |\n"
        "***WARNING*** Bad grad_norm detected (grad_norm=inf)\n"
        " " + " | ".join(_iteration(901, "", loss=None, skipped=1)) + " |\n"
    )  # fmt: skip
    doc = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["check"], doc["summary"]["step"]) == ("skip-nonfinite-grad", 901)
    assert "weak evidence" in doc["verdict"] and "the loss was NaN" not in doc["verdict"]


def test_a_missing_loss_alone_is_said_to_be_weak(tmp_path, capsys):
    log = "".join(" " + " | ".join(_iteration(s, "", loss=None)) + " |\n" for s in (5, 6))
    doc = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["metric"], doc["summary"]["step"], doc["summary"]["kind"]) == ("lm loss", 5, None)
    assert "weak evidence alone" in doc["verdict"]
    assert doc["metrics"]["first_nonfinite"]["weak"] is True
