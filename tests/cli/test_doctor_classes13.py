"""Issue 41, round 13: the classes holdout13 (25 reports doctor had never read, graded on main 7f6dca2) read partly or
wrongly, each on crafted input of its class in the stack's own format: a framework named by a config or recipe given
as the launch script (1-4), by unsloth's rewritten training loop (5) or by a traceback pasted after the error (6), a
frame's code line taken for a message (7), a NaN warning followed by another error that ended the run (8), and a
Trainer dict glued after its own step's bar (9). Each positive test fails on round 12's doctor (main 7f6dca2)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor
from tests.cli.doctoring import refused_script as _refused

pytestmark = pytest.mark.usefixtures("wide_terminal")


_DICT = "{'loss': 60.5735, 'grad_norm': nan, 'learning_rate': 8e-06, 'epoch': 0.12}\n"
_LF_YAML = ("### model\nmodel_name_or_path: Qwen2.5-VL-3B\ntrust_remote_code: true\n### method\nstage: sft\ndo_train: true\n"
            "finetuning_type: full\nfreeze_vision_tower: true  # choices: [true, false]\ndeepspeed: z3.json\n"
            "### dataset\ndataset: mllm_demo\ntemplate: qwen2_vl\ncutoff_len: 2048\n")  # fmt: skip


# 1-2. a LLaMA-Factory YAML config (llamafactory-cli's) given as the script, beside the Trainer's log
# (hiyouga/LlamaFactory#7388), and alone
def test_1_a_framework_s_yaml_config_names_the_framework(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _DICT, script="这是我使用的参数\n" + _LF_YAML)
    assert doc["framework"]["name"] == "llama-factory"
    assert doc["framework"]["how"].startswith("the file given as the launch script is a YAML config of llama-factory's")


def test_2_a_config_alone_is_refused_naming_what_it_is(tmp_path, capsys):
    assert "it is a YAML config of llama-factory's (its keys stage, finetuning_type)" in _refused(
        tmp_path, capsys, _LF_YAML
    )


# 3-4. axolotl's YAML config (axolotl-ai-cloud/axolotl#2326) and xtuner's Python config (InternLM/xtuner#507)
def test_3_axolotl_s_config_alone(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "base_model: m\nsequence_len: 4096\nsample_packing: true\nmicro_batch_size: 2\n")
    assert "it is a YAML config of axolotl's (its keys sample_packing, micro_batch_size)" in err


def test_4_xtuner_s_python_config_alone(tmp_path, capsys):
    config = ("# Model\npretrained_model_name_or_path = 'internlm/internlm2-chat-7b'\nprompt_template = "
              "PROMPT_TEMPLATE.internlm2_chat\nmax_length = 2048\nbatch_size = 1  # per_device\n")  # fmt: skip
    assert "it is a Python config of xtuner's (PROMPT_TEMPLATE)" in _refused(tmp_path, capsys, config)


# 5. a NeMo-Run recipe given as the script, beside Megatron's error (NVIDIA-NeMo/Speech#15108)
def test_5_a_nemo_run_recipe_names_nemo(tmp_path, capsys):
    error = ("RuntimeError: Rank 0, node f0f5, device 0, iteration -1: Unexpected result nan (message='found NaN in "
             "local grad norm for bucket #0 in backward pass before data-parallel communication collective')\n")  # fmt: skip
    recipe = "import nemo_run as run\nfrom nemo.collections import llm\nrecipe = llm.qwen3_600m.pretrain_recipe()\n"
    doc, _ = _doctor(tmp_path, capsys, error, script=recipe)
    assert doc["framework"]["name"] == "nemo" and doc["failure"]["rank"] == 0


# 6. unsloth's training loop: its frame is `<string>` (unslothai/unsloth#427)
def test_6_unsloth_s_rewritten_loop_names_unsloth(tmp_path, capsys):
    log = ('Traceback (most recent call last):\n  File "<string>", line 361, in _fast_inner_training_loop\n  File '
           '"/env/site-packages/trl/trainer/policy_trainer_base.py", line 549, in training_step\n    '
           "self.accelerator.backward(loss)\nRuntimeError: Function 'LoRA_MLPBackward' returned nan values in its 0th "
           "output.\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "unsloth" and "it calls trl" in out


# 7. a traceback's tail, then a whole one pasted after it (jstmn/ikflow#23): its frames name Lightning, and the
# frame's code line `raise ValueError("loss is nan")` is no message of its own
_IKFLOW = """  File "/ikflow/training/lt_model.py", line 203, in training_step
    raise ValueError("loss is nan")
ValueError: loss is nan
Traceback (most recent call last):
  File "/ikflow/scripts/train.py", line 255, in <module>
    trainer.fit(model, data_module)
  File "/env/site-packages/pytorch_lightning/trainer/trainer.py", line 561, in fit
    call._call_and_handle_interrupt(
"""


def test_7_a_later_traceback_names_the_framework_and_code_is_no_message(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _IKFLOW)
    assert doc["framework"]["name"] == "lightning" and doc["failure"]["line"] == 3
    assert "Before it, line 2 says" not in out and [s["check"] for s in doc["signals"]["signals"]] == [
        "nonfinite-error"
    ]


# 8. NeMo's NaN warning, then an error that names no NaN ended the run (NVIDIA-NeMo/Speech#711)
def test_8_a_warning_then_another_error(tmp_path, capsys):
    log = ("[NeMo W 2020-06-05 23:23:22 actions:1580] Loss is NaN or inf. Skipping update.\nTraceback (most recent "
           'call last):\n  File "/NeMo/nemo/backends/pytorch/actions.py", line 1561, in train\n    raise ValueError(f"A '
           'NMTensor was produced twice")\nValueError: A NMTensor was produced twice in the same DAG.\n')  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert "The run then ended on an error that names no NaN or Inf: ValueError: A NMTensor was produced twice in the same DAG." in out  # fmt: skip


# 9. a Trainer dict with its grad_norm glued after the bar of its own step (hiyouga/LlamaFactory#7388)
@pytest.mark.parametrize(("keys", "step"), [("'grad_norm': nan, ", 1), ("'reward': nan, ", 2)])
def test_9_a_trainer_dict_glued_after_its_step_s_bar(keys, step, tmp_path, capsys):
    log = f"  0%|▏     | 1/249 [00:26<1:47:45, 26.07s/it]{{'loss': nan, {keys}'learning_rate': 8e-06, 'epoch': 0.12}}\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["first_nonfinite"]["step"] == step
