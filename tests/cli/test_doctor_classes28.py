"""Issue 41, round 28: the readings holdout25 left partial and a re-grade of the consumed sets found, on crafted
input of each class; each positive test fails on a1a92c5."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")

_TABLE = "-------------------------\n| grad_norm     | 2.34e+05 |\n| lg_loss_scale | {lg}   |\n| loss          | 5.99e+04 |\n| step          | 200      |\n-------------------------\n"  # fmt: skip


# 1. guided-diffusion's logger table prints the log2 of its fp16 loss scale (`| lg_loss_scale | -0.821 |`,
# tomeramit/SegDiff#20, holdout25 05): below 0 is a scale under 1, from a start of 2^20, every step overflowing
def test_1_a_log2_loss_scale_below_0_is_a_collapsed_scale(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _TABLE.format(lg="-0.821"))
    assert (
        "The lg_loss_scale its metric lines print is -0.821 at line 3 (step 200): the log2 of guided-diffusion's fp16 "
        "loss scale (improved-diffusion's the same), which starts at 20, falls by 1 on each step whose gradients hold "
        "inf or NaN (that step skipped) and rises by 0.001 on every other, so at least 21 steps overflowed and were "
        "skipped; a scale below 1 means the gradients overflow fp16 whatever the scale: not a calibration."
    ) in " ".join(out.split())
    assert "no non-finite value" not in out
    summary = doc["summary"]
    assert (summary["check"], summary["metric"], summary["step"]) == ("loss-scale-collapsed", "lg_loss_scale", None)
    assert doc["metrics"]["loss_scale_collapsed"] == {"scale": 2.0**-0.821, "line": 3, "step": 200, "log2": -0.821}


def test_1_a_log2_loss_scale_above_0_is_no_collapse(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _TABLE.format(lg="15.2  "))
    assert doc["metrics"]["loss_scale_collapsed"] is None and doc["summary"]["check"] is None
    assert "lg_loss_scale" not in out and "no non-finite value" in out


# 1. the same for a printed scale far below any start (fairseq's `loss_scale 0.000`): the summary names it (it was
# empty: a verdict sentence and no check)
def test_1_a_collapsed_printed_scale_is_the_summary_s_check(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _TABLE.replace("lg_loss_scale", "loss_scale   ").format(lg="0.0005"))
    assert (doc["summary"]["check"], doc["summary"]["metric"]) == ("loss-scale-collapsed", "loss scale")
    assert doc["metrics"]["loss_scale_collapsed"] == {"scale": 0.0005, "line": 3, "step": 200}


# 2. a framework nanscope does not catalogue, named by the input (its frames' packages, its logger's name: accelerate,
# tf_agents, tensorflow, rl_coach, rsl_rl, recbole in the consumed sets): said as shown, not "nothing names it"
def test_2_the_libraries_the_input_shows_are_said_where_no_catalogued_framework_is_named(tmp_path, capsys):
    log = (
        "INFO:tensorflow:global_step/sec: 3.1\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.10/site-packages/accelerate/accelerator.py", line 1905, in backward\n'
        "    loss.backward(**kwargs)\n"
        '  File "/venv/lib/python3.10/site-packages/torch/_tensor.py", line 522, in backward\n'
        "    torch.autograd.backward(\n"
        "RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    shows = "the input shows accelerate (its frames), tensorflow (its log lines)"
    assert doc["framework"] == {"name": "unknown", "release": None, "how": f"no framework nanscope catalogues; {shows}"}
    assert f"No framework nanscope catalogues is named ({shows}), so no framework's own causes are weighed." in out
    assert "candidate causes (6: the catalogued causes that fit this input)" in out


def test_2_torch_s_frames_alone_name_no_library_and_nothing_is_said_to_name_none(tmp_path, capsys):
    log = (
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.10/site-packages/torch/_tensor.py", line 522, in backward\n'
        "    torch.autograd.backward(\n"
        "RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["how"] == "nothing in the input names a framework nanscope catalogues"
    assert "Nothing in the traceback names a framework nanscope catalogues, so no framework's own causes" in out


# 3. a hardware cause under another stack's run is a device's fault, not "a fault in the model"
def test_3_a_device_fault_is_said_to_be_the_device_s(tmp_path, capsys):
    script = "deepspeed --num_gpus 8 src/train_bash.py --stage dpo --model_name_or_path m --bf16\n"
    log = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
    doc, _ = _doctor(tmp_path, capsys, log, script)
    assert doc["framework"]["name"] == "llama-factory"
    (transient,) = [c for c in doc["candidates"] if c["id"] == "transient-fault"]
    assert transient["evidence"][0] == "a device that computed a wrong value once: no flag enables or excludes it"


# 4. a finite loss far past its range beside a non-finite gradient norm (transformers' Trainer, holdout14 19; a loss
# from 14 to 8195, holdout24 08): the loss's growth, not "the backward pass" alone
def test_4_a_huge_finite_loss_beside_a_nan_grad_norm_points_to_the_loss_s_size(tmp_path, capsys):
    log = (
        "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
        "{'loss': 153318.95, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.2}\n"
    )
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["points_to"] == (
        "the loss's size before its backward pass: the loss on the line is finite but 153319, past 1000, and the "
        "gradient norm is not: the gradients of a loss that large overflow, so its growth is where to look first (a "
        "backward op alone can do it too: anomaly mode names it)"
    )
    doc, _ = _doctor(tmp_path, capsys, log.replace("153318.95", "2.29"))
    assert doc["summary"]["points_to"].startswith("the backward pass: the loss on the line is finite")
