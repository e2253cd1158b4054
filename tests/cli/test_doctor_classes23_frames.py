"""Issue 41, round 23: the frame classes of holdout23 (reports doctor had never read), on crafted input of each class:
a traceback of several processes whose `File "` lines were lost, read by its code lines (09); the forward call
anomaly mode prints (02); TensorFlow's CheckNumerics saying which of NaN and Inf it found (12); a metric's name of
several words (11). Each positive test fails on main e40e49b."""

import pytest

from nanscope.cli.main import main
from nanscope.launch.frames import parse_frames
from nanscope.launch.line_pairs import pairs
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. a traceback several processes printed at once, their lines glued and most `File "` lines lost (holdout23 09,
# Llama-Chinese#66): CPython prints each frame as `  File "...", line N, in f` then its code line indented by four
# (Lib/traceback.py, StackSummary.format_frame_summary); what is left is the code lines of transformers' Trainer
# (4.31.0 trainer.py:1809), accelerate's DeepSpeed branch (0.21.0 accelerator.py:1847), DeepSpeed's engine (0.16.4
# engine.py:2322) and ZeRO optimizer (stage_1_and_2.py:2077), cut before the error line
_GLUED = (
    "    tr_loss_step = self.training_step(model, inputs)    tr_loss_step = self.training_step(model, inputs)\n"
    "    self.deepspeed_engine_wrapped.backward(loss, **kwargs)\n"
    "        self.deepspeed_engine_wrapped.backward(loss, **kwargs)self._take_model_step(lr_kwargs)\n"
    "    self._take_model_step(lr_kwargs)\n"
    "    self.loss_scaler.update_scale(has_overflow)    self.loss_scaler.update_sc\n"
)
_POINTS = (
    "Its last known code line, `self.loss_scaler.update_scale(has_overflow)`, is DeepSpeed's ZeRO optimizer's: its step "
    "updates the fp16 loss scale after its overflow check (_update_scale); the loss scaler's update raises only where "
    "the fp16 loss scale is already at its minimum and the step overflowed again (DeepSpeed 0.16.4 "
    "deepspeed/runtime/fp16/loss_scaler.py:174-176): what the frames point to, their error line cut."
)


def test_1_a_traceback_left_with_its_code_lines_is_read_by_them(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _GLUED)
    assert doc["framework"] == {
        "name": "transformers",
        "release": None,
        "how": "its code line `tr_loss_step = self.training_step(model, inputs)` is transformers' Trainer's "
        "(transformers 4.31.0 src/transformers/trainer.py:1809 Trainer._inner_training_loop); it calls deepspeed",
        "stack": None,
    }
    assert (
        "The traceback ends before its error line: only its frames say what happened. The frames of several processes "
        "interleave in it (lines glued mid-line): each is read once. Its code lines are frames of transformers' Trainer "
        "(`tr_loss_step = self.training_step(model, inputs)`), accelerate's Accelerator "
        "(`self.deepspeed_engine_wrapped.backward(loss, **kwargs)`), DeepSpeed's engine "
        "(`self._take_model_step(lr_kwargs)`) and DeepSpeed's ZeRO optimizer "
        "(`self.loss_scaler.update_scale(has_overflow)`) (the releases they were read at: under what the frames show). "
        + _POINTS
    ) in out
    assert "no error line: the traceback ends before it" in out
    assert (
        "code line `self.deepspeed_engine_wrapped.backward(loss, **kwargs)`: accelerate's Accelerator (accelerate 0.21.0 "
        "src/accelerate/accelerator.py:1847 Accelerator.backward): its backward hands the loss to DeepSpeed's engine"
    ) in out
    assert [line["text"] for line in doc["code_lines"]] == [
        "tr_loss_step = self.training_step(model, inputs)",
        "self.deepspeed_engine_wrapped.backward(loss, **kwargs)",
        "self._take_model_step(lr_kwargs)",
        "self.loss_scaler.update_scale(has_overflow)",
    ]
    assert doc["summary"]["check"] is None and doc["summary"]["points_to"].endswith(
        "the call on the last known code line, `self.loss_scaler.update_scale(has_overflow)`; what the frames point "
        "to, the error line itself cut"
    )


# LLaMA-Factory's entry script before llamafactory-cli (hiyouga/LLaMA-Factory v0.1.0 src/train_bash.py:10, main's
# run_sft), its one `File "` line left among the glued code lines
def test_1_a_frame_in_llama_factorys_entry_script_names_it(tmp_path, capsys):
    entry = '    tr_loss_step = self.training_step(model, inputs)  File "/root/LLaMA2/src/train_bash.py", line 10, in main\n'
    doc, out = _doctor(tmp_path, capsys, entry + _GLUED)
    assert doc["framework"] == {
        "name": "llama-factory",
        "release": None,
        "how": "a frame in train_bash.py (train_bash.py:10 main): LLaMA-Factory's entry script up to v0.7.0, "
        "LLaMA-Efficient-Tuning's then; it calls transformers, deepspeed",
        "stack": None,
    }
    assert _POINTS in out


# a text another library's frame holds too (mmcv 1.7.2 Fp16OptimizerHook's `self.loss_scaler.update_scale(has_overflow)`,
# whose scaler never raises): alone it names neither, and points to nothing
def test_1_a_shared_code_line_alone_names_no_stack(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "    self.loss_scaler.update_scale(has_overflow)self.loss_scaler.update_scale(has_overflow)\n")  # fmt: skip
    assert doc["framework"]["name"] == "unknown"
    assert (
        "Its code lines are frames of DeepSpeed's ZeRO optimizer (DeepSpeed 0.16.4 deepspeed/runtime/zero/stage_1_and_2.py"
        ":2077 and stage3.py:2464 _update_scale (0.10.0: :1908, :2127)) or mmcv's (mmcv 1.7.2 "
        "mmcv/runner/hooks/optimizer.py:490 Fp16OptimizerHook.after_train_iter) (`self.loss_scaler.update_scale(has_overflow)`)"
    ) in out
    assert "what the frames point to" not in out and doc["summary"]["points_to"] is None


@pytest.mark.parametrize(
    "line",
    [
        "    x = self.loss_scaler.update_scale(has_overflow) + 1",  # part of a longer statement
        "    return self.loss_scaler.update_scale(has_overflow)",
        "    self.loss_scaler.update_scale(has_overflow).wait()",
    ],
)
def test_1_a_known_text_inside_another_statement_is_no_frame(tmp_path, capsys, line):
    doc, out = _doctor(tmp_path, capsys, line + "\n")
    assert doc.get("code_lines", []) == [] and "code line" not in out


def test_1_unknown_frames_without_a_nan_word_stay_refused(tmp_path, capsys):
    log = tmp_path / "job.log"
    log.write_text(
        '    out = self.step(batch)  File "/home/me/train.py", line 10, in main\n'
        "        loss = model(x)loss = model(x)\n"
    )
    assert main(["doctor", "--traceback", str(log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Megatron error found" in err


# 2. autograd's anomaly mode: `Error detected in <node>. Traceback of forward call that caused the error:` then the
# stack stored at the forward op, outermost first (pytorch/pytorch 042876c torch/csrc/autograd/python_anomaly_mode.cpp
# :16-25, :113-116), c10's `(Triggered internally at ...)` and the warnings module's source line after it
# (CPython Lib/warnings.py, _formatwarnmsg_impl); then the error's own traceback (holdout23 02, microsoft/LoRA#186)
_ANOMALY = (
    "/usr/lib/python3.10/site-packages/torch/autograd/graph.py:768: UserWarning: Error detected in MmBackward0. "
    "Traceback of forward call that caused the error:\n"
    '  File "/work/train.py", line 88, in <module>\n'
    "    out = model(batch)\n"
    '  File "/usr/lib/python3.10/site-packages/peft/tuners/lora/layer.py", line 569, in forward\n'
    "    result = result + lora_B(lora_A(dropout(x))) * scaling\n"
    '  File "/usr/lib/python3.10/site-packages/torch/nn/modules/linear.py", line 117, in forward\n'
    "    return F.linear(input, self.weight, self.bias)\n"
    " (Triggered internally at ../torch/csrc/autograd/python_anomaly_mode.cpp:111.)\n"
    "  return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass\n"
    "Traceback (most recent call last):\n"
    '  File "/work/train.py", line 90, in <module>\n'
    "    loss.backward()\n"
    '  File "/usr/lib/python3.10/site-packages/torch/_tensor.py", line 521, in backward\n'
    "    torch.autograd.backward(\n"
    "RuntimeError: Function 'MmBackward0' returned nan values in its 1th output.\n"
)
_ORDER = (
    "it prints that stack outermost first (pytorch/pytorch 042876c torch/csrc/autograd/python_anomaly_mode.cpp:16-25, "
    ":113-116; torch/fx/traceback.py)."
)


def test_2_the_forward_calls_last_frame_is_named(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ANOMALY)
    assert (
        "Anomaly mode traced the forward call of MmBackward0 (line 1): its last frame, "
        "/usr/lib/python3.10/site-packages/torch/nn/modules/linear.py:117 forward, `return F.linear(input, self.weight, "
        "self.bias)`, is where the forward op was called; " + _ORDER
    ) in out
    assert doc["anomaly_forward"] == {
        "path": "/usr/lib/python3.10/site-packages/torch/nn/modules/linear.py",
        "line": 117,
        "function": "forward",
        "code": "return F.linear(input, self.weight, self.bias)",
        "frames": 3,
        "lines_left_out_after": False,
        "short_of_op": None,  # round 24: the last frame is the op's own call
    }
    assert [frame["line"] for frame in doc["frames"]] == [90, 521]  # the error's own traceback, not the forward's


# the same warning pasted with its frames left out (`...`) and markdown's bold over a frame, which took its `File "`
def test_2_a_frame_whose_head_markdown_took_is_the_last_shown(tmp_path, capsys):
    log = (
        "UserWarning: Error detected in AddmmBackward0. Traceback of forward call that caused the error:\n...\n"
        '**src/mymodel/layers.py", line 42, in forward\n    h = self.proj(torch.cat([h, skip], dim=-1))**\n...\n'
        "RuntimeError: Function 'AddmmBackward0' returned nan values in its 2th output.\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert (
        "Anomaly mode traced the forward call of AddmmBackward0 (line 1): its last frame shown is "
        "src/mymodel/layers.py:42 forward, `h = self.proj(torch.cat([h, skip], dim=-1))`: the forward op runs within "
        "that call (the paste leaves lines out after it, so the op's own call may be a frame further in); " + _ORDER
    ) in out
    assert doc["anomaly_forward"]["lines_left_out_after"] is True


def test_2_a_path_wrapped_onto_the_next_line_is_no_lost_head():
    lines = [
        'Exception  File "/home/x/lib/python3.11/site-packages/deepspeed/r',
        'untime/fp16/loss_scaler.py", line 175, in update_scale',
    ]
    assert parse_frames(lines)[0] == []


# 3. TensorFlow's CheckNumerics appends which it found to its caller's message: `{message} : Tensor had {NaN|Inf|Inf
# and NaN} values` (tensorflow 07ca580 tensorflow/core/kernels/check_numerics_op.cc:83-97), under it the op's path,
# here longer than 300 characters (a tf.function's nested calls and loops: holdout23 12, tensorforce#738)
_PATH = (
    "agent/StatefulPartitionedCall/agent/cond/then/_120/agent/StatefulPartitionedCall_3/policy_optimizer/"
    "StatefulPartitionedCall/policy_optimizer/while/body/_900/policy_optimizer/while/StatefulPartitionedCall/"
    "policy_optimizer/cond/then/_1500/policy_optimizer/cond/StatefulPartitionedCall/policy_optimizer/VerifyFinite/"
    "CheckNumerics"
)


@pytest.mark.parametrize(
    "status, kind, said",
    [("NaN", "NaN", "found NaN"), ("Inf", "Inf", "found Inf"), ("Inf and NaN", "NaN or Inf", "found both")],
)
def test_3_check_numerics_says_which_it_found(tmp_path, capsys, status, kind, said):
    log = (
        "tensorflow.python.framework.errors_impl.InvalidArgumentError:  Invalid gradient: contains inf or nan. : "
        f"Tensor had {status} values\n\t [[{{{{node {_PATH}}}}}]] [Op:__inference_observe_1234]\n\nFunction call "
        "stack:\nobserve\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["kind"], doc["summary"]["op"], doc["summary"]["model"]) == (
        kind,
        "policy_optimizer/VerifyFinite/CheckNumerics",
        "policy",
    )
    assert (
        f"(line 1; policy_optimizer/VerifyFinite/CheckNumerics; Tensor had {status} values: TensorFlow's CheckNumerics "
        f"{said} (the words before it are its caller's message))"
    ) in out


def test_3_a_message_naming_both_without_checknumerics_words_stays_both(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "ValueError: Invalid gradient: contains inf or nan.\n")
    assert doc["summary"]["kind"] == "NaN or Inf"


# 4. a metric's name of several words before its `: value` (rl_coach's Logger.log_dict, IntelLabs/coach v1.0.0
# rl_coach/logger.py:89-100: `{prefix} - {key}: {value} ...` as a terminal shows it, `{prefix}> {key}={value}, ...`
# uncoloured; holdout23 11, coach#418)
@pytest.mark.parametrize(
    "line",
    [
        "Policy training - Surrogate loss: -0.0123 KL divergence: nan Entropy: nan training epoch: 0 "
        "learning_rate: 0.0003 ",
        "Policy training> Surrogate loss=-0.0123, KL divergence=nan, Entropy=nan, training epoch=0, learning_rate=0.0003",
    ],
)
def test_4_a_name_of_several_words_is_one_key(tmp_path, capsys, line):
    doc, out = _doctor(tmp_path, capsys, line + "\n")
    assert doc["summary"]["metric"] == "KL divergence"
    assert ": KL divergence nan, Entropy nan" in out


@pytest.mark.parametrize(
    "line, keys",
    [
        ("INFO loss: nan, acc: 0.5", ["loss", "acc"]),  # a logger's level
        ("loss: 1.0 and grad_norm: nan", ["loss", "grad_norm"]),  # a sentence's word
        ("time: 3 ms loss: nan", ["time", "loss"]),  # a unit after the value before
        ("step 3 loss: nan", ["step", "loss"]),  # one `:` pair: no line of such pairs
    ],
)
def test_4_words_that_name_no_metric_stay_out_of_the_key(line, keys):
    assert [key for key, _, _ in pairs(line)] == keys
