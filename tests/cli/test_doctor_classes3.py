"""Issue 41, round 3: the classes of misreading found on 29 reports doctor had never read (real3/), each on crafted
input of its class (never the report's own string): named non-finite values outside known metric shapes (a), steps
from the wrong number (b), a traceback cut before its head whose ranks interleave (c), known evidence cut at its end
(d), metrics computed before the update (e), causes for the wrong kind of run (f), an overflow monitor's error line
(g), whose optimizer printed an overflow (h), counts of one (i), training CLIs' launch commands (j), and a text that
shows no NaN failure at all (k). Each test fails on round 2's doctor."""

import json

import pytest

from nanscope.cli.main import main

FIELDS = ("rank", "kind", "check", "step", "model", "metric")
RL_CAUSES = ("kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward", "zero-temperature",
             "rollout-logprob-shift", "logprob-drift")  # fmt: skip


pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(tmp_path, capsys, log: str | None = None, script: str | None = None) -> tuple[dict, str]:
    argv = ["doctor"]
    if script is not None:
        (tmp_path / "run.sh").write_text(script)
        argv.append(str(tmp_path / "run.sh"))
    if log is not None:
        (tmp_path / "job.log").write_text(log)
        argv += ["--traceback", str(tmp_path / "job.log")]
    out = tmp_path / "d.json"
    code = main([*argv, "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), captured.out


def _summary(doc: dict) -> dict:
    return {key: doc["summary"][key] for key in FIELDS}


# a. named non-finite values outside the known metric shapes


@pytest.mark.parametrize(
    ("log", "metric", "kind"),
    [
        ("wandb: Run summary:\nwandb:    train/loss nan\nwandb:            lr 1e-05\n", "train/loss", "NaN"),
        ("policy loss tensor(inf, device='cuda:1', grad_fn=<AddBackward0>)\n", "policy loss", "Inf"),
        ("margin tensor([nan], device='cuda:3', dtype=torch.bfloat16)\n", "margin", "NaN"),
        ("  val_ppl=tensor(NaN, device='cuda:2') val_loss=tensor(NaN, device='cuda:2')\n", "val_ppl", "NaN"),
        ("KL: -inf:  12%|██    | 120/1000 [01:00<07:20,  2.00it/s]\n", "KL", "Inf"),
    ],
    ids=["wandb summary", "printed tensor", "1-element tensor", "epoch summary", "bar description"],
)
def test_a_named_nonfinite_value_is_read_in_any_line(log, metric, kind, tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["metric"], doc["summary"]["kind"]) == (metric, kind)


@pytest.mark.parametrize(
    "line",
    ["reading shard /data/nan/part-0.bin", "weights at 0xnan1f2e", "loaded module foo.nan", "epoch 3 of run-nan-7"],
)
def test_a_path_a_hex_value_or_a_word_is_no_metric(line, tmp_path, capsys):
    """Round 4: readable text is never refused; the word is no non-finite value (round 3: exit 2)."""
    doc, _ = _doctor(tmp_path, capsys, line + "\n")
    assert doc["summary"]["benign"] == (
        "no non-finite value and no error found in 1 line (what was read: plain lines, no metric line)"
    )
    assert doc["summary"]["kind"] is None


# b. steps from a counter or a bar's count, never a percentage or a time


def test_b_a_bar_s_percentage_is_never_the_step(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "Steps:   1%|▏    | 42/4000 [00:10<15:00,  4.40it/s, lr=1e-5, loss=nan]\n")
    assert (doc["summary"]["step"], doc["summary"]["metric"]) == (42, "loss")


def test_b_a_time_key_holding_step_is_never_the_step(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "time/update/step=812, env/reward=0.5, train/loss=nan, train/lr=1e-6\n")
    assert (doc["summary"]["step"], doc["summary"]["metric"]) == (None, "train/loss")
    doc, _ = _doctor(tmp_path, capsys, "global_step=40, time/update/step=812, train/loss=nan, train/lr=1e-6\n")
    assert doc["summary"]["step"] == 40


def test_b_a_print_over_a_bar_s_start_is_the_next_step(tmp_path, capsys):
    log = "score tensor([nan], device='cuda:0')                | 7/50 [00:14<01:20,  2.00s/it, a=1]\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["step"], doc["summary"]["metric"]) == (8, "score")


# c. a traceback cut before its head, its ranks' frames interleaved


def test_c_interleaved_frames_without_an_error_line_are_read(tmp_path, capsys):
    stage3 = '  File "/opt/py/site-packages/deepspeed/runtime/zero/stage3.py", line 1900, in step\n'
    engine = '  File "/opt/py/site-packages/deepspeed/runtime/engine.py", line 2100, in step\n'
    log = (engine + "    self._take_model_step(lr_kwargs)        self.optimizer.step()\n" + engine + stage3
           + "self.optimizer.step()\n" + stage3 + "    self._overflow_check()\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "deepspeed"
    assert "ends before its error line" in doc["verdict"]
    assert "interleave" in doc["verdict"] and "ZeRO stage 3 optimizer (stage3.py:1900 step)" in doc["verdict"]
    assert len(doc["frames"]) == 2


# d. known evidence cut at its end


def test_d_a_watchdog_line_cut_mid_word_is_a_timeout(tmp_path, capsys):
    log = "{'loss': 2.1, 'grad_norm': 0.9, 'epoch': 0.1}\n[rank3]:[E101 ProcessGroupNCCL.cpp:600] [Rank 3] Watchdog caught collective oper\n"  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["check"], doc["summary"]["rank"]) == ("nccl-timeout", None)
    assert "no error line" not in doc["verdict"]
    assert doc["signals"]["waiting_ranks"] == [3]


def test_d_an_overflow_line_cut_after_its_rank_is_counted(tmp_path, capsys):
    line = "[INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {0}, reducing to {1}\n"  # fmt: skip
    log = line.format(65536, 32768) + line.format(32768, 16384) + "[INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipp\n"  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["signals"]["signals"][0]["count"] == 3


# e. metrics computed before the update point to that computation


def test_e_advantages_non_finite_with_rewards_finite_point_to_the_advantages(tmp_path, capsys):
    log = "epoch=3, rollout/rewards_mean=0.25, rollout/returns_mean=nan, train/actor/pg_loss=nan, train/actor/kl=0.01\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    said = doc["summary"]["points_to"]
    assert doc["summary"]["metric"] == "rollout/returns_mean" and doc["summary"]["model"] == "actor"
    assert "before the update" in said and "rollout/rewards_mean 0.25" in said and "the loss itself" not in said


# f. causes for the run's kind


@pytest.mark.parametrize(
    ("script", "kind"),
    [
        (
            "CUDA_VISIBLE_DEVICES=0,1 NPROC_PER_NODE=2 swift rlhf --rlhf_type kto --model m --train_type lora\n",
            "preference",
        ),
        ("NPROC_PER_NODE=8 megatron pt --model m --tensor_model_parallel_size 2\n", "pretraining"),
        ("deepspeed --num_gpus 8 -m openrlhf.cli.train_rm --pretrain m --save_path out\n", "reward-model"),
        ("torchrun --nproc_per_node 4 src/train.py --stage sft --model_name_or_path m\n", "sft"),
    ],
    ids=["swift rlhf kto", "megatron pt", "openrlhf train_rm", "llama-factory --stage sft"],
)
def test_f_a_run_without_rollouts_is_offered_no_rl_cause(script, kind, tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, script=script)
    assert doc["run_kind"]["kind"] == kind and doc["run_kind"]["rollouts"] is False
    status = {c["id"]: c["status"] for c in doc["candidates"]}
    assert [cause for cause in RL_CAUSES if status.get(cause, "ruled-out") != "ruled-out"] == []
    assert "The run is " in doc["verdict"]


def test_f_an_rl_run_keeps_its_rl_causes(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, script="python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=8\n")
    assert doc["run_kind"] == {"kind": "rl", "how": "the entry point -m verl.trainer.main_ppo", "rollouts": True}
    assert {c["id"] for c in doc["candidates"] if c["status"] != "ruled-out"} & set(RL_CAUSES)


# g. an overflow monitor's error line


def test_g_an_overflow_monitor_ending_the_run_is_persistent_overflow(tmp_path, capsys):
    log = ('Traceback (most recent call last):\n  File "run/train.py", line 9, in <module>\n    main()\n'
           "Exception: Skipped 25 iterations in a row due to Overflow - Exiting training.\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["check"], doc["summary"]["kind"], doc["summary"]["metric"]) == (
        "overflow-exit",
        "NaN or Inf",
        None,
    )
    assert "ends before its error line" not in doc["verdict"] and "its scale calibrating" not in doc["verdict"]
    assert "persistent" in doc["verdict"] and doc["summary"]["benign"] is None


# h. whose optimizer printed an overflow


@pytest.mark.parametrize(
    ("file", "said"),
    [
        ("stage_1_and_2.py:1700:step", "ZeRO stage 1 and 2"),
        ("stage3.py:2500:_overflow_clean_up", "ZeRO stage 3"),
        ("stage2.py:1357:step", "ZeRO stage 2"),
    ],  # fmt: skip
)
def test_h_the_logger_s_file_names_the_optimizer(file, said, tmp_path, capsys):
    log = f"[2022-01-01 00:00:00,000] [INFO] [{file}] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512\n"  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert said in doc["verdict"] and "0.3's" not in doc["verdict"]
    assert doc["signals"]["signals"][0]["printed_by"] == ["deepspeed"]


# i. counts of one


def test_i_one_node_is_said_in_the_singular(tmp_path, capsys):
    script = "torchrun --nproc_per_node 2 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 4\n"
    _, out = _doctor(tmp_path, capsys, script=script)
    assert "= 1 node x 2 GPUs" in out and "1 nodes" not in out


# j. training CLIs' launch commands


@pytest.mark.parametrize(
    ("script", "framework", "said"),
    [
        ("NPROC_PER_NODE=4 xtuner train my_config.py --deepspeed deepspeed_zero3\n", "xtuner", "4 processes a node"),
        (
            "tune run --nproc_per_node 2 lora_finetune_distributed --config my/2B_lora\n",
            "torchtune",
            "2 processes a node",
        ),
        ("llamafactory-cli train examples/my_lora_sft.yaml\n", "llama-factory", "no process count"),
        ("accelerate launch --num_processes 8 --num_machines 2 train.py --lr 1\n", "unknown", "2 nodes x 4 GPUs"),
    ],
    ids=["xtuner", "tune", "llamafactory-cli", "accelerate"],
)
def test_j_a_training_cli_is_a_launch(script, framework, said, tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, script=script)
    assert doc["framework"]["name"] == framework
    assert said in " ".join(out.split())
    assert doc["topology"] is None  # no megatron-core: no layout invented


def test_j_a_deepspeed_config_s_stage_is_said_by_its_name(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, script="NPROC_PER_NODE=4 xtuner train cfg.py --deepspeed deepspeed_zero3\n")
    assert "ZeRO stage 3, by its name" in out


# k. a text that shows no NaN failure


def test_k_an_isolated_nonfinite_gradient_norm_that_recovers_is_no_failure(tmp_path, capsys):
    rows = [(0.5, "nan"), (0.49, "0.8"), (0.48, "0.7"), (0.47, "nan"), (0.47, "0.6")]
    log = "".join(f"{{'loss': {loss}, 'grad_norm': {norm}, 'learning_rate': 1e-05, 'epoch': 0.{i}}}\n" for i, (loss, norm) in enumerate(rows))  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["metric"] == "grad_norm" and "finite again (line 2)" in doc["summary"]["benign"]
    assert "Not a NaN failure by itself" in doc["verdict"]


def test_k_a_gradient_norm_that_stays_nonfinite_is_a_failure(tmp_path, capsys):
    log = "".join(f"{{'loss': {loss}, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.{i}}}\n" for i, loss in enumerate((1.2, 7.9, 7.9)))  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["benign"] is None


def test_k_finite_lines_alone_are_no_failure(tmp_path, capsys):
    log = " iteration 5/100 | consumed samples: 320 | elapsed time per iteration (ms): 800.1 | lm loss: 2.1E+00 | loss scale: 1.0 | grad norm: 0.9 | number of skipped iterations: 0 | number of nan iterations: 0 |\n"  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["benign"] == (
        "no non-finite value and no error found in 1 line (what was read: the metric lines of megatron-lm, up to step 5)"
    )
