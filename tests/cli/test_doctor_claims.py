"""Every value doctor reads is checked (issue 42 item 5), and no claim it cannot back (issue 41 item 4): a size that is
no size is a finding, never a default; a flag carries its own framework's meaning; a command cut by a comment inside
its continuation is said to be cut; CUDA_VISIBLE_DEVICES counts; no slime flag and no template word for another
framework's job."""

import json
from pathlib import Path

import pytest

from nanscope.cli.main import main

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"


pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(tmp_path, capsys, script_text: str | None, *extra: str) -> tuple[int, dict, str]:
    argv = ["doctor", "--json", str(tmp_path / "d.json"), *extra]
    if script_text is not None:
        script = tmp_path / "launch.sh"
        script.write_text(script_text)
        argv.insert(1, str(script))
    code = main(argv)
    captured = capsys.readouterr()
    doc = json.loads((tmp_path / "d.json").read_text()) if code in (0, 1) else {}
    return code, doc, captured.out + captured.err


NEMO_TB = str(REPORTS / "nemo-14348.log")


@pytest.mark.parametrize(
    ("script", "line"),
    [
        ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers -4\n",
         "--num-layers -4: must be >= 1"),
        ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 0\n",
         "--tensor-model-parallel-size 0: must be >= 1"),
        ("nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=0\n",
         "trainer.strategy.tensor_model_parallel_size=0: must be >= 1"),
        ("python3 -m verl.trainer.main_ppo trainer.nnodes=2 trainer.n_gpus_per_node=0\n",
         "trainer.n_gpus_per_node=0: must be >= 1"),
        ("torchrun --nnodes 9223372036854775808 --nproc_per_node 8 pretrain_gpt.py\n",
         "--nnodes 9223372036854775808: over 1,048,576, more than nanscope lays out"),
        ("torchrun --nproc_per_node 8 pretrain_gpt.py --pipeline-model-parallel-size two\n",
         "--pipeline-model-parallel-size two: not a whole number"),
    ],
    ids=["num-layers-negative", "tp-zero", "nemo-tp-zero", "verl-gpus-zero", "world-2-63", "not-a-number"],
)  # fmt: skip
def test_a_value_that_is_no_size_is_a_finding_never_a_default(script, line, tmp_path, capsys):
    """Before: `--num-layers -4` exit 0 as if nothing were wrong; NeMo TP 0 with a traceback a ZeroDivisionError;
    verl with n_gpus_per_node=0 laid out as 2 nodes x 8 GPUs."""
    code, doc, out = _doctor(tmp_path, capsys, script, "--traceback", NEMO_TB)
    assert code == 0, out
    assert [finding["title"] for finding in doc["findings"]] == [line]
    assert doc["topology"] is None and f"The launch script gives values that are no size: {line}" in doc["verdict"]


def test_a_slime_launch_refuses_the_same_values_in_one_line(tmp_path, capsys):
    code, _, out = _doctor(tmp_path, capsys, "python3 train.py --actor-num-nodes 1 --num-layers -4 --colocate\n")
    assert code == 2 and out.strip().splitlines() == [
        "nanscope doctor: error: --num-layers -4 (launch script): must be >= 1"
    ]


def test_a_megatron_lm_launch_gives_its_layer_split_from_its_own_flags(tmp_path, capsys):
    """Before: `pretrain_gpt.py --num-layers 4` said "num-layers unknown: pass --model JSON or --model-args FILE";
    a split Megatron refuses is said, and the layout (and the experts per rank) kept."""
    launch = "torchrun --nproc_per_node 8 pretrain_gpt.py --pipeline-model-parallel-size 2 --num-layers {} "
    launch += "--num-experts 8 --expert-model-parallel-size 4\n"
    code, doc, out = _doctor(tmp_path, capsys, launch.format(4))
    assert code == 0 and "num-layers unknown" not in out, out
    assert [s["layers"] for s in doc["topology"]["stages"]] == [[0, 1], [2, 3]]
    assert doc["topology"]["experts_per_ep_rank"] == 2
    code, doc, out = _doctor(tmp_path, capsys, launch.format(5))
    assert code == 0 and doc["topology"]["stages"] is None and doc["topology"]["experts_per_ep_rank"] == 2
    assert [n for n in doc["notes"] if "layer" in n] == [
        "model sizes not used (--num-layers 5 --num-experts 8): num-layers(5) % pp(2) = 1 != 0: Megatron splits the "
        "layers evenly over the pipeline stages (uneven: --decoder-first/last-pipeline-num-layers)"
    ]


VERL_CUT = """export CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.actor.strategy=megatron \\
    # actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \\
    # trainer.logger=['console'] \\
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \\
    trainer.n_gpus_per_node=7 \\
    trainer.nnodes=1
"""


def test_a_comment_in_a_continuation_cuts_the_command_and_visible_devices_count(tmp_path, capsys):
    """Before: the command cut at line 5 went unmentioned and the 7 visible GPUs were laid out as world 8."""
    code, doc, _ = _doctor(tmp_path, capsys, VERL_CUT)
    assert code == 0
    cut = (
        "line 5: a `#` comment line inside the command's `\\` continuation ends the command there, as bash does: line "
        "7 on (`actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1` ...) is not its arguments, and what "
        "those lines set is not read"
    )
    assert cut in doc["notes"] and f"The launch script's train command is cut short: {cut}." in doc["verdict"]
    assert doc["inputs"]["argv"] == ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.strategy=megatron"]
    assert (doc["topology"]["world"], doc["topology"]["gpus_per_node"]) == (7, 7)
    assert (
        "GPUs per node not given: 7, the devices CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 names (verl's own default, "
        "trainer.n_gpus_per_node 8, would not fit them)"
    ) in doc["notes"]


def test_visible_devices_against_the_count_the_launch_gives(tmp_path, capsys):
    script = "CUDA_VISIBLE_DEVICES=0,1 python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.n_gpus_per_node=8\n"
    _, doc, _ = _doctor(tmp_path, capsys, script)
    assert (
        "trainer.n_gpus_per_node=8 but CUDA_VISIBLE_DEVICES=0,1 names 2 devices: the processes of a node see 2"
        in (doc["notes"])
    )


def _evidence(doc, cause):
    return next(c["evidence"] for c in doc["candidates"] if c["id"] == cause)


def test_finetune_loads_no_optimizer_state(tmp_path, capsys):
    """ms-swift's `--finetune true` was read as "loaded weights and optimizer state"; Megatron's --finetune loads no
    optimizer or RNG state (ms-swift passes it to Megatron)."""
    script = "NPROC_PER_NODE=8 megatron sft --tensor_model_parallel_size 2 --load /ckpt --finetune true\n"
    _, doc, _ = _doctor(tmp_path, capsys, script)
    assert _evidence(doc, "bad-checkpoint-resume")[:2] == [
        "--load /ckpt: the run loads weights and, unless --no-load-optim or --finetune, the optimizer and RNG state",
        "--finetune true: the run loads weights only: no optimizer or RNG state, the iteration reset to 0 "
        "(Megatron's --finetune)",
    ]
    assert not any("optimizer state" in line and "weights and optimizer" in line for line in doc["verdict"].split("."))


SLIME_WORDS = ("--rollout-temperature", "--tis-clip", "--save-debug-rollout-data", "NANSCOPE_", "the plugin",
               "sentinel", "slime's", "slime v")  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        ("--traceback", str(REPORTS / "verl-747.log")),
        ("--traceback", str(REPORTS / "nemo-14348.log")),
        ("--traceback", str(REPORTS / "megatron-lm-780.txt")),
    ],
    ids=["verl", "nemo", "unknown"],
)
def test_another_frameworks_job_gets_no_slime_flag_and_no_template_word(extra, tmp_path, capsys):
    code, doc, out = _doctor(tmp_path, capsys, None, *extra)
    assert code == 0
    said = " ".join(
        [doc["verdict"], *doc["notes"], *(c["discriminator"] or "" for c in doc["candidates"])]
        + [line for c in doc["candidates"] for line in c["evidence"]]
    )
    assert not [word for word in SLIME_WORDS if word in said], said
    assert "unknown's" not in out and "the script loads" not in out and "in the script" not in said


def test_an_unknown_frameworks_launch_is_not_called_unknowns(tmp_path, capsys):
    _, doc, out = _doctor(tmp_path, capsys, "torchrun --nproc_per_node 2 my_train.py --lr 1\n")
    assert doc["framework"]["name"] == "unknown" and "unknown's" not in " ".join(out.split())
