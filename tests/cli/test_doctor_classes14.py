"""Issue 41, round 14: the classes holdout14 (25 reports doctor had never read, graded on main 933f1b7) read partly or
wrongly, each on crafted input of its class in the stack's own format: a framework named by a log's first lines or
keys when nothing in it is non-finite (1-5), a config read as a log (6), a flag list or a Python repro given as the
script (7-8), a preference log's NaN log-probs beside a loss of 0 (9), an evaluation's loss alone (10) and DeepSpeed's
skip counter (11). Each positive test fails on round 13's doctor (main 933f1b7)."""

import pytest

from tests.cli.doctoring import doctor_log as _doctor
from tests.cli.doctoring import refused_script as _refused

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1-5. what names the stack of a log that shows nothing non-finite (pytorch/torchtitan#1232, mcgill-nlp/llm2vec#174,
# jzhang38/TinyLlama#153, huggingface/trl#1057, verl-project/verl#2535, Lightning-AI/litgpt#140)
@pytest.mark.parametrize(
    ("log", "framework"),
    [
        ("[titan] 2025-05-30 09:58:25,340 - root - INFO - step:  1  loss: -1.0000  memory: 40.2GiB(50.8%)  tps: 312\n",
         "torchtitan"),
        ("[INFO|trainer.py:2128] 2024-08-01 10:00:00,000 >> ***** Running training *****\n", "transformers"),
        ("***** train metrics *****\n  epoch = 5.0\n  train_loss = 0.0063\n", "transformers"),
        ("{'eval_loss': nan, 'eval_runtime': 12.3, 'eval_samples_per_second': 8.1, 'eval_steps_per_second': 1.0}\n",
         "transformers"),
        ("step:2\nactor/pg_loss:0.0123\nactor/grad_norm:127.3\ncritic/score/mean:0.25\n", "verl"),
        ("/env/site-packages/lightning/fabric/fabric.py:810: UserWarning: The model passed to `Fabric.setup()` ...\n"
         "iter 0: loss 2.1300, time: 812.00ms\n", "lightning"),
    ],
)  # fmt: skip
def test_1_a_log_s_first_lines_and_keys_name_its_framework(log, framework, tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == framework


# 6. a LLaMA-Factory YAML config with a `max_grad_norm: 0.5` line read as a job log (hiyouga/LlamaFactory#9462)
def test_6_a_yaml_config_is_no_log(tmp_path, capsys):
    config = ("### model\nmodel_name_or_path: Qwen3-32B-AWQ\n### method\nstage: sft\nfinetuning_type: lora\n"
              "### train\nlearning_rate: 1.0e-4\nmax_grad_norm: 0.5\nfp16: true\nloss: 0.2\n")  # fmt: skip
    doc, _ = _doctor(
        tmp_path, capsys, "{'loss': 1.2, 'grad_norm': 0.16, 'learning_rate': 1e-05, 'epoch': 0.1}\n", script=config
    )
    assert doc["framework"]["name"] == "llama-factory"


# 7-8. Megatron-LM's flags pasted without their command (NVIDIA/Megatron-LM#1469); a TRL repro script (huggingface/trl#2553)
def test_7_a_megatron_flag_list_is_named(tmp_path, capsys):
    flags = "--lr 4.2e-4\n--micro-batch-size 1\n--num-layers 28\n--hidden-size 2048\n--tensor-model-parallel-size 1\n"
    assert "it is a list of Megatron-LM's flags (--micro-batch-size, --num-layers, --hidden-size, ...)" in _refused(tmp_path, capsys, flags)  # fmt: skip


def test_8_a_python_repro_names_the_framework_it_imports(tmp_path, capsys):
    repro = "from datasets import load_dataset\nfrom trl import DPOConfig, DPOTrainer\n\nconfig = DPOConfig(beta=0.9)\n"
    assert "it is a Python file of trl's (it imports trl)" in _refused(tmp_path, capsys, repro)


# 9. ms-swift DPO: log-probs NaN while the loss prints 0.0 and grad_norm 1.0 (modelscope/ms-swift#5418): no claim that
# the loss is non-finite
def test_9_nan_log_probs_beside_a_zero_loss_point_to_the_policy(tmp_path, capsys):
    log = ('{"loss": 0.0, "grad_norm": 1.0, "rewards/chosen": NaN, "logps/chosen": NaN, "logps/rejected": NaN, '
           '"global_step/max_steps": "5/3750"}\n')  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["points_to"].startswith("the policy's forward pass: its log-probs are non-finite")


# 10. an evaluation's loss alone (mcgill-nlp/llm2vec#174): no training loss after it says whether the weights were
# finite (round 27: tests/cli/test_doctor_classes27.py)
def test_10_an_evaluation_loss_alone(tmp_path, capsys):
    doc, _ = _doctor(
        tmp_path, capsys, "{'eval_loss': nan, 'eval_accuracy': 0.0, 'eval_runtime': 12.3, 'epoch': 0.08}\n"
    )
    assert doc["summary"]["points_to"].startswith("the evaluation, or weights the update before it made non-finite")


# 11. DeepSpeed's `skipped=` counter is a skip counter, not a non-finite metric (deepspeedai/DeepSpeed#1773)
def test_11_deepspeed_s_skip_counter_is_said_as_one(tmp_path, capsys):
    log = ("[2022-02-16 01:23:00,852] [INFO] [stage_1_and_2.py:1651:step] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
           "Attempted loss scale: 4294967296, reducing to 2147483648.0\n[2022-02-16 01:23:01,101] [INFO] "
           "[logging.py:69:log_dist] [Rank 0] step=2, skipped=2, lr=[0.0001], mom=[(0.9, 0.95)]\n")  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert "A skip counter rose: skipped 2 by step 2" in out and "The first non-finite metric: skipped" not in out


# 12. a wrapper nanscope cannot follow, whose text names the framework (pytorch/torchtitan#1056, holdout12 27)
def test_12_a_wrapper_s_text_names_its_framework(tmp_path, capsys):
    script = (
        'CONFIG_FILE="./torchtitan/models/llama/train_configs/llama3_8b.toml" ./run_train.sh --training.steps 100\n'
    )
    err = _refused(tmp_path, capsys, script)
    assert "(a wrapper: it runs ./run_train.sh (line 1)" in err and err.endswith(
        "; its text names torchtitan (torchtitan/models/)\n"
    )
