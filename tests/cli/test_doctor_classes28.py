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
        "inf or NaN (that step skipped) and rises by 0.001 on every other, so at least 21 steps were skipped; a scale "
        "below 1 means the gradients hold inf or NaN even unscaled (an overflow, or a non-finite forward pass or "
        "weights, which no scale helps): not a calibration."
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
    assert doc["framework"] == {"name": "unknown", "release": None, "how": f"no framework nanscope catalogues; {shows}",
                                "stack": None}  # fmt: skip
    assert f"No framework nanscope catalogues is named ({shows}), so no framework's own causes are weighed." in out
    assert "candidate causes (6: the catalogued causes weighed for this input)" in out


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


# 5. a total and several of its terms non-finite on one record (`loss: nan  loss_rpn_cls: nan  loss_rpn_bbox: nan`,
# open-mmlab/mmdetection, holdout15 10; guided-diffusion's sorted table, holdout25 04): the line does not say which
# term went first, so the total is named, with them, not the first term printed
def test_5_several_nonfinite_terms_of_a_total_name_none_of_them_first(tmp_path, capsys):
    log = "Epoch [1][50/500]  loss: 1.2  loss_rpn_cls: 0.3  loss_cls: 0.9\nEpoch [1][100/500]  loss: nan  loss_rpn_cls: nan  loss_cls: nan  acc: 0.0\n"  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["metric"], doc["summary"]["also"]) == ("loss", ["loss_rpn_cls", "loss_cls"])
    assert "with loss_rpn_cls, loss_cls non-finite in the same record too (which went first the record does not" in out
    doc, _ = _doctor(tmp_path, capsys, log.replace("loss_rpn_cls: nan", "loss_rpn_cls: 0.3"))
    assert (doc["summary"]["metric"], doc["summary"]["also"]) == ("loss", ["loss_cls"])  # a bare loss beside one


# 6. NeMo 1's Hydra command line (NeMo-Aligner's train_gpt_sft.py, holdout20 09): Lightning's `trainer.devices=-1` is
# every visible GPU, not "no size" (a HIGH finding that the script is not the one that ran), and the model's
# parallel sizes (`model.pipeline_model_parallel_size=4`, `+model.context_parallel_size=2`) are read, not CP 1 / PP 1
_NEMO1 = (
    "python -u examples/nlp/gpt/train_gpt_sft.py trainer.num_nodes=2 trainer.devices=-1 "
    "model.tensor_model_parallel_size=2 model.pipeline_model_parallel_size=4 model.sequence_parallel=True "
    "+model.context_parallel_size=2\n"
)


def test_6_nemo_1_s_every_device_and_model_sizes_are_read(tmp_path, capsys):
    log = "Epoch 0: 10%| 5/50 [00:10<01:30, reduced_train_loss=nan, global_step=4.000]\n"
    doc, out = _doctor(tmp_path, capsys, log, _NEMO1)
    assert doc["framework"]["name"] == "nemo"
    assert [f["id"] for f in doc["findings"] if f["id"] == "not-a-size"] == []
    assert "gpus per node: trainer.devices=-1: every visible GPU, a count the script does not give" in out
    layout = doc["topology"]
    assert (layout["tp"], layout["pp"], layout["cp"], layout["nodes"]) == (2, 4, 2, 2)
    assert "gpus per node: not given" not in out
    (masked,) = [c for c in doc["candidates"] if c["id"] == "cp-rank-all-masked"]
    assert masked["status"] != "ruled-out"


def test_6_torchrun_s_nproc_per_node_auto_is_every_visible_gpu(tmp_path, capsys):
    script = "torchrun --nnodes 1 --nproc_per_node auto pretrain_gpt.py --tensor-model-parallel-size 2\n"
    doc, out = _doctor(tmp_path, capsys, "iteration 3/ 100 | lm loss: nan |\n", script)
    assert [f["id"] for f in doc["findings"] if f["id"] == "not-a-size"] == []
    assert "gpus per node: --nproc_per_node auto: every visible GPU, a count the script does not give" in out


# 7. DeepSpeed's log_dist prefix before its FP16 optimizer's overflow line (holdout16 02): rank 0 prints it
def test_7_a_log_dist_rank_prefix_names_who_logs_the_overflow(tmp_path, capsys):
    log = (
        "[2023-04-15 05:51:04,058] [INFO] [logging.py:96:log_dist] [Rank 0] Overflow detected. Skipping step. "
        "Attempted loss scale: 1, reducing to 1\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    (signal,) = doc["signals"]["signals"]
    assert "rank 0 logs it (DeepSpeed prints it on rank 0 only)" in out
    assert signal["check"] == "deepspeed-overflow"


# 8. lines at one time stamp are several processes only where they repeat one message (DeepSpeed's three messages of
# one overflow in one millisecond, holdout12 11, are one process's); icefall's `(rank/world)` prefix names the ranks
# (holdout25 24)
def test_8_one_time_stamp_is_several_processes_only_for_one_message_and_names_its_ranks(tmp_path, capsys):
    stamp = "2023-03-06 12:41:16,652 WARNING [trainer.py:680]"
    log = f"{stamp} (2/4) Grad scale is small: 0.0\n{stamp} (0/4) Grad scale is small: 0.0\n"
    _, out = _doctor(tmp_path, capsys, log)
    assert (
        "all at one time stamp, 2023-03-06 12:41:16,652: several processes at once (ranks 2 and 0 of 4, as their "
        "`(rank/world)` prefixes say)" in " ".join(out.split())
    )
    stamp = "[2021-12-19 16:54:45,098] [INFO]"
    log = (
        f"{stamp} [unfused_optimizer.py:275:_update_scale] Grad overflow on iteration: 445299\n"
        f"{stamp} [unfused_optimizer.py:277:_update_scale] Reducing dynamic loss scale from 1 to 1\n"
        f"{stamp} [unfused_optimizer.py:202:step] [deepspeed] fp16 dynamic loss scale overflow! Skipping step.\n"
    )
    _, out = _doctor(tmp_path, capsys, log)
    assert "several processes" not in out


# 5. the other metrics non-finite on the first record are said with it (`grad_norm=nan, loss=nan`, holdout25 01):
# the record does not say which went first
def test_5_the_other_nonfinite_metrics_of_the_first_record_are_said(tmp_path, capsys):
    log = "step=1 grad_norm=1.5 loss=2.1 lr=1e-4\nstep=2 grad_norm=nan loss=nan lr=1e-4\n"
    doc, out = _doctor(tmp_path, capsys, log)
    assert (doc["summary"]["metric"], doc["summary"]["also"]) == ("grad_norm", ["loss"])
    assert (
        "The first non-finite metric: grad_norm at step 2 (line 2), with loss non-finite in the same record too (which "
        "went first the record does not say)." in " ".join(out.split())
    )


# 9. DeepSpeed prints its scale through int(): `Attempted loss scale: 0, reducing to 0` is a scale below 1 still
# halved, not a floor (holdout17 04); and a scale below 1 is no proof that every step is skipped (fairseq's
# num_updates keep rising under it, holdout17 19)
def test_9_an_int_printed_zero_scale_is_below_1_not_a_floor(tmp_path, capsys):
    log = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 0, reducing to 0\n" * 2
    _, out = _doctor(tmp_path, capsys, log)
    flat = " ".join(out.split())
    assert "The loss scale prints as 0: DeepSpeed prints the scale through int()" in flat
    assert "at its floor" not in flat
    log = "| WARNING: overflow detected, setting loss scale to: 0.0625\n| WARNING: overflow detected, setting loss scale to: 0.03125\n"  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert "does not train" not in out and "below 1: halved on overflow after overflow" in " ".join(out.split())


# 10. causes ruled out by sizes or defaults the input never gave: CP 1 / PP 1 for a launch without megatron-core that
# sets neither (a JAX job, holdout17 20), verl's default sequence parallelism with no launch script (holdout19 21)
def test_10_no_cause_is_ruled_out_by_a_size_or_default_the_input_does_not_give(tmp_path, capsys):
    megatron = ("cp-rank-all-masked", "non-flash-attention-mask-pp", "sp-new-architecture")
    doc, _ = _doctor(tmp_path, capsys, "step 5 | loss nan | grad_norm nan\n", "python train.py --lr 1e-4 --bf16\n")
    assert [c["id"] for c in doc["candidates"] if c["id"] in megatron] == []  # not offered: nothing runs megatron-core
    doc, _ = _doctor(tmp_path, capsys, "{'actor/pg_loss': nan, 'actor/grad_norm': nan, 'critic/vf_loss': 0.1}\n")
    assert doc["framework"]["name"] == "verl"
    assert [c["id"] for c in doc["candidates"] if c["id"] in megatron] == []


# 11. DeepSpeed's `[deepscale] OVERFLOW! Rank 0` of ZeRO stage 2 is printed on every rank (v0.3.10 zero/stage2.py:
# 1357-1361, no rank check: holdout17 09), stage 3's on rank 0 only (v0.4.0 zero/stage3.py:2695-2700)
def test_11_deepscale_s_stage_2_line_is_every_rank_s_and_stage_3_s_rank_0_s(tmp_path, capsys):
    line = "[2021-02-25 01:12:29,563] [INFO] [{}:1357:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8388608.0, reducing to 4194304.0\n"  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, line.format("stage2.py"))
    assert doc["failure"]["other_ranks"] == ["rank 0 logs it (ZeRO stage 2 prints this line on every rank once the "
                                             "overflow flag is all-reduced: an overflow on any rank, not rank 0's own)"]  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, line.format("stage3.py"))
    assert doc["failure"]["other_ranks"] == ["rank 0 logs it (DeepSpeed prints it on rank 0 only)"]


# 6. NeMo 1's checkpoint overrides (holdout20 09): model.restore_from_path loads a .nemo file's weights,
# exp_manager.resume_if_exists a run directory's last checkpoint where one exists
def test_6_nemo_1_s_restore_and_resume_overrides_load_a_checkpoint(tmp_path, capsys):
    script = _NEMO1.replace("\n", " model.restore_from_path=/m/a.nemo exp_manager.resume_if_exists=True\n")
    doc, _ = _doctor(tmp_path, capsys, "Epoch 0: 10%| 5/50 [00:10<01:30, reduced_train_loss=nan]\n", script)
    (resume,) = [c for c in doc["candidates"] if c["id"] == "bad-checkpoint-resume"]
    assert resume["status"] == "enabled"
    assert resume["evidence"][:2] == [
        "model.restore_from_path=/m/a.nemo: the run loads weights only (a pretrained checkpoint: no optimizer state)",
        "exp_manager.resume_if_exists=True: the run loads weights and optimizer state of the run directory's last "
        "checkpoint, where one exists (NeMo's resume_if_exists)",
    ]


# 1. a bordered table whose NaN rows come first: the collapse is said at the lg_loss_scale row (holdout25 04)
def test_1_a_collapse_is_said_at_its_own_row(tmp_path, capsys):
    log = "-----------------------------\n| lg_loss_scale | -1.62e+04 |\n| loss          | nan       |\n| step          | 1.53e+05  |\n-----------------------------\n"  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["metrics"]["loss_scale_collapsed"]["line"] == 2


def test_9_a_float_zero_scale_is_still_a_floor(tmp_path, capsys):
    """The int() reading is DeepSpeed's loss scaler's: ZeRO stage 2's older line prints the float, `0.0, reducing to
    0.0`, a scale at 0 (holdout21 03)."""
    line = "[INFO] [stage2.py:1357:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 0.0, reducing to 0.0\n"  # fmt: skip
    _, out = _doctor(tmp_path, capsys, line * 2)
    flat = " ".join(out.split())
    assert "The loss scale is at its floor (0 -> 0)" in flat
    assert "through int()" not in flat
