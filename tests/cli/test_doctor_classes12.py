"""Issue 41, round 12: the classes holdout12 (27 reports doctor had never read, graded on main 5cb828c) read partly
or wrongly, each on crafted input of its class in the stack's own format: a framework named only by what its
launch runs or its log's keys (1-8), a traceback that ends in an error naming no NaN (9-10), a metric record printed
as indented JSON (11), a loss non-finite beside a finite gradient norm (12), a table column that names no metric
(13), the last progress bar before a cut traceback (14) and a YAML config given as the launch script (15). Each
positive test fails on round 11's doctor (main 5cb828c)."""

import json

import pytest

from nanscope.cli.main import main
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _script(tmp_path, capsys, script: str) -> tuple[dict, str]:
    (tmp_path / "train.sh").write_text(script)
    out = tmp_path / "d.json"
    assert main(["doctor", str(tmp_path / "train.sh"), "--json", str(out)]) == 0
    return json.loads(out.read_text()), " ".join(capsys.readouterr().out.replace("│", " ").split())


# 1-8. what a launch runs, or its log's keys, names the framework (hiyouga/LlamaFactory#551, #2916, #2078;
# Liuziyu77/Visual-RFT#39; NVIDIA-NeMo/Megatron-Bridge#1865; pytorch/torchtitan#1056; EleutherAI/gpt-neox#947;
# NVIDIA-NeMo/ProRL-Agent-Server#40)
@pytest.mark.parametrize(
    ("script", "framework", "how", "kind"),
    [
        ("CUDA_VISIBLE_DEVICES=0 python src/train_bash.py --stage dpo --model_name_or_path m --template default\n",
         "llama-factory", "the script src/train_bash.py", "preference"),
        ("python my_train.py --stage sft --finetuning_type lora --template default\n",
         "llama-factory", "its flag --finetuning_type", "sft"),
        ("torchrun --nproc_per_node 8 src/open_r1/grpo.py --deepspeed zero3.json --num_generations 2\n",
         "trl", "the script src/open_r1/grpo.py", "rl"),
        ("python scripts/performance/setup_experiment.py -m llama31 -s 405b -ng 128 -c nvfp4\n",
         "nemo", "the script scripts/performance/setup_experiment.py", None),
        ("IMAGE=nvcr.io/nvidia/nemo:25.11\npython run_pretrain.py --recipe llama3_70b\n",
         "nemo", "the script names nvcr.io/nvidia/nemo:", None),
        ("python torchtitan/train.py --job.config_file torchtitan/models/llama3/train_configs/llama3_8b.toml\n",
         "torchtitan", "the script torchtitan/train.py", None),
    ],
)  # fmt: skip
def test_1_what_a_launch_runs_names_its_framework(script, framework, how, kind, tmp_path, capsys):
    doc, _ = _script(tmp_path, capsys, script)
    assert (doc["framework"]["name"], doc["framework"]["how"]) == (framework, how)
    if kind is not None:
        assert doc["run_kind"]["kind"] == kind


def test_7_slime_s_step_keys_name_slime_when_every_value_is_finite(tmp_path, capsys):
    log = ("step 1: {'train/loss': 0.10, 'train/pg_loss': 0.10, 'train/grad_norm': 2955012562.8, "
           "'train/lr-pg_0': 1e-07}\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "slime" and "its metric lines' keys (train/lr-pg_0)" in out


def test_8_gpt_neox_s_iteration_line(tmp_path, capsys):
    line = (" samples/sec: 1.702 | iteration        1/   55000 | elapsed time per iteration (ms): 18806.7 | learning "
            "rate: 1.212E-09 | approx flops per GPU: 5.7TFLOPS | lm_loss: nan | number of skipped iterations:   0 | "
            "number of nan iterations:   1 |\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, line)
    assert doc["framework"]["name"] == "gpt-neox" and doc["summary"]["metric"] == "lm_loss"


# 9-10. a traceback whose error names no NaN is another failure, not one cut before its error line
# (verl-project/verl#4060: TRL's value head on a VL critic), also pasted with its newlines lost
_ATTRIBUTE = """Traceback (most recent call last):
  File "/env/lib/python3.12/site-packages/trl/models/modeling_value_head.py", line 178, in forward
    if lm_logits.dtype != torch.float32:
       ^^^^^^^^^^^^^^^
AttributeError: 'NoneType' object has no attribute 'dtype'
"""


@pytest.mark.parametrize("log", [_ATTRIBUTE, " ".join(_ATTRIBUTE.split("\n")[1:]).strip() + "\n"], ids=["lines", "squashed"])  # fmt: skip
def test_9_a_traceback_ending_in_another_error_says_so(log, tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, log)
    assert ("The traceback ends in an error that names no NaN or Inf: AttributeError: 'NoneType' object has no "
            "attribute 'dtype'. Not a NaN failure by itself: the traceback ends in another error, and no value the "
            "text prints is non-finite.") in out  # fmt: skip
    assert doc["framework"]["name"] == "trl" and doc["summary"]["benign"] is not None
    assert "error line (it names no NaN or Inf): AttributeError: 'NoneType' object has no attribute 'dtype'" in out


def test_10_a_cut_traceback_is_still_cut(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, _ATTRIBUTE.rsplit("AttributeError", 1)[0])
    assert "The traceback ends before its error line: only its frames say what happened." in out


# 11. transformers' trainer_state.json log_history: one key a line, the step after the values (huggingface/trl#1371)
_LOG_HISTORY = """"log_history": [
    {
      "epoch": 0.0,
      "grad_norm": NaN,
      "learning_rate": 0.0,
      "logps/chosen": NaN,
      "loss": 9078019.2,
      "rewards/chosen": NaN,
      "step": 5
    },
"""


def test_11_an_indented_json_record_is_read_whole(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _LOG_HISTORY)
    first = doc["metrics"]["first_nonfinite"]
    assert (first["step"], first["metric"], first["model"]) == (5, "grad_norm", "policy")
    assert [key for key, _ in first["values"]] == ["grad_norm", "logps/chosen", "rewards/chosen"]
    assert doc["metrics"]["later_nonfinite_lines"] == 0  # one record, read once


# 12. KTO's loss NaN beside a finite gradient norm: a mean over an empty subset, not the model (huggingface/trl#1447)
def test_12_a_loss_beside_a_finite_gradient_norm_is_a_logged_aggregate(tmp_path, capsys):
    log = ("{'loss': nan, 'grad_norm': 41.94, 'learning_rate': 2e-06, 'rewards/chosen': 0.0, 'rewards/rejected': nan, "
           "'kl': 0.0, 'logps/chosen': -32.9, 'logps/rejected': nan, 'epoch': 0.0}\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["points_to"].startswith("a logged aggregate, not the model: the loss is non-finite while the "
                                                  "gradient norm on the line is finite")  # fmt: skip


# 13. a pasted table whose column names a run, and nothing names the metric (deepspeedai/DeepSpeed#5347)
def test_13_a_column_that_names_no_metric_is_said_so(tmp_path, capsys):
    table = "| Step | Stage2_1node_ds0.14.0 |\n|------|------|\n| 37 | 1.61 |\n| 38 | 1.51 |\n| 39 | NaN |\n"
    doc, _ = _doctor(tmp_path, capsys, table)
    assert (doc["summary"]["metric"], doc["summary"]["step"]) == ("Stage2_1node_ds0.14.0 (a column that names no metric)", 39)  # fmt: skip


# 14. a traceback cut before its error, after a progress bar (modelscope/ms-swift#4374)
def test_14_the_last_progress_bar_before_a_cut_traceback(tmp_path, capsys):
    log = ("Train:   4%|4         | 1234/28155 [3:30:37<54:49:54,  7.33s/it]\n[rank1]: Traceback (most recent call "
           'last):\n[rank1]:   File "/ms-swift/swift/cli/rlhf.py", line 5, in <module>\n[rank1]:     rlhf_main()\n')  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert "The last progress bar in the text shows step 1234 done (line 1)." in out


# 15. a YAML config given as the launch script (inclusionAI/AReaL#136): named as such in its one line
def test_15_a_yaml_config_given_as_the_script_is_named(tmp_path, capsys):
    (tmp_path / "train.sh").write_text("actor:\n  backend: megatron\n  bf16: false\nrollout:\n  - n: 8\n")
    assert main(["doctor", str(tmp_path / "train.sh")]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "; it is a YAML config (top-level keys: actor, rollout), not a bash launch script" in err
    )
