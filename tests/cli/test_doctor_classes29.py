"""Issue 41, round 29: readings the round-28 re-check still graded wrong, on crafted input of each class; each
positive test fails on 4a0fda2."""

import pytest

from nanscope.launch import loop_counters
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")

_MEGATRON = (" iteration        {n}/ 2753818 | consumed samples: {s} | learning rate: 1.000E-07 | global batch size: 8 |"
             " loss scale: {scale} | number of skipped iterations:   {skipped} | number of nan iterations:   0 |\n")  # fmt: skip


def _iterations(*rows: tuple[int, float, int]) -> str:
    return "".join(_MEGATRON.format(n=n, s=8 * n, scale=scale, skipped=skipped) for n, scale, skipped in rows)


# 1. Megatron's iteration lines hold one loss scale while every iteration is skipped (holdout12 09): no dynamic scaler
# at its default hysteresis does that, so it is not "its scale calibrating"
def test_1_a_scale_held_over_skipped_iterations_is_no_calibration(tmp_path, capsys):
    doc, out = _doctor(
        tmp_path, capsys, _iterations((1, 16384.0, 1), (2, 16384.0, 1), (3, 16384.0, 1), (4, 16384.0, 1))
    )
    assert "calibrating" not in out
    assert doc["summary"]["points_to"] == (
        "gradients that overflow at a loss scale that does not move: every iteration from 1 to 4 skipped, none of them "
        "an update of the weights"
    )
    assert (
        "The loss scale stays 16384 (2^14) while every iteration from 1 to 4 is skipped (the skip counter covers each "
        "line's iterations): Megatron's dynamic scaler lowers it once its hysteresis (default 2) is spent, so over 3 "
        "more skipped iterations in a row it would have fallen; the scale is static (--loss-scale, whose overflowing "
        "steps are skipped all the same), at its floor (--min-loss-scale), or the hysteresis is at least 5"
    ) in out


@pytest.mark.parametrize(
    "rows",
    [
        ((1, 16384.0, 1), (2, 8192.0, 1), (3, 4096.0, 1)),  # halving: a dynamic scaler at work
        ((1, 16384.0, 1), (2, 16384.0, 1)),  # one more skip: a default hysteresis of 2 holds it too
        ((1, 16384.0, 1), (2, 16384.0, 0), (3, 16384.0, 1), (4, 16384.0, 1)),  # a step taken between
        ((1, 16384.0, 1), (5, 16384.0, 1), (9, 16384.0, 1)),  # lines 4 apart, 1 skipped each: not every iteration
    ],
)
def test_1_no_held_scale_where_the_lines_do_not_show_one(rows, tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _iterations(*rows))
    assert "The loss scale stays" not in out
    assert "does not move" not in (doc["summary"]["points_to"] or "")


# 2. TRL's ORPO has no reference model (holdout12 02); finite logits beside non-finite log-probs clear the logits
_ORPO = ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 2.5e-08, 'rewards/chosen': nan, 'logps/rejected': nan, "
         "'logps/chosen': nan, 'logits/rejected': -3.11, 'logits/chosen': -3.11, 'nll_loss': nan, 'log_odds_ratio': nan, "
         "'log_odds_chosen': nan, 'epoch': 0.0}\n")  # fmt: skip


def test_2_orpo_s_log_probs_have_no_reference_and_finite_logits_clear_the_forward(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _ORPO)
    points = doc["summary"]["points_to"]
    assert "the reference's are not logged" not in points
    assert points == (
        "the policy's log-probs, not its logits: they are non-finite while logits/rejected, logits/chosen on the line "
        "are finite (a mean over the logits: none of them NaN), so the step from logits to log-probs: ORPO averages a "
        "response's log-probs over its label tokens, and a response with none (a prompt that fills the length limit) "
        "is 0/0 (trl f2cd577 trl/experimental/orpo/orpo_trainer.py:698-705, :743-744, :805-809); its reward is beta "
        "times them: it has no reference model"
    )


def test_2_dpo_without_logits_keeps_the_reference_said(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "{'loss': 0.69, 'rewards/chosen': nan, 'logps/chosen': nan, 'epoch': 0.1}\n")
    assert doc["summary"]["points_to"] == (
        "the policy's forward pass: its log-probs are non-finite (a preference reward is a log-ratio of them); the "
        "reference's are not logged"
    )


# 3. an epoch, a loop's only counter, is said as the epoch, not as a step (holdout19 03, holdout23 11)
def test_3_an_epoch_is_no_step(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "Epoch 1/1 with loss inf\n")
    assert (doc["summary"]["step"], doc["summary"]["epoch"]) == (None, "1")
    assert "The first non-finite metric: loss (the line names no step; epoch 1) (line 1)." in out
    assert "at step 1" not in out


def test_3_the_finer_counter_is_still_the_step():
    assert loop_counters.step_of("000 epoch, 06000 iter, average time 0.66, loss nan", []) == (
        6000,
        "the line (iter 06000: its iter counter)",
        False,
    )
    assert loop_counters.step_of("Epoch: 0564 D loss: nan G loss: nan", []).epoch


# 4. anomaly mode's warning: its `(Triggered internally at ...)` end is the same warning, and a last frame in torch's
# wrapper of a Tensor operator calls the op: the expression is the frame outside torch (holdout25 08)
_WARNING = (
    "/opt/conda/lib/python3.7/site-packages/torch/autograd/__init__.py:175: UserWarning: Error detected in "
    "PowBackward0. Traceback of forward call that caused the error:\n"
    '  File "train.py", line 1006, in train\n    img_loss0 = img2mse(rgb0, target_s)\n'
    '  File "/w/run_nerf_helpers.py", line 15, in <lambda>\n    img2mse = lambda x, y : torch.mean((x - y) ** 2)\n'
    '  File "/opt/conda/lib/python3.7/site-packages/torch/_tensor.py", line 32, in wrapped\n'
    "    return f(*args, **kwargs)\n"
    " (Triggered internally at  ../torch/csrc/autograd/python_anomaly_mode.cpp:102.)\n"
)


def test_4_one_anomaly_warning_is_one_line_and_its_operator_frame_is_torch_s(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _WARNING)
    assert "more such line" not in out
    assert (
        "its last frame, /opt/conda/lib/python3.7/site-packages/torch/_tensor.py:32 wrapped, `return f(*args, "
        "**kwargs)`, is torch's wrapper of a Tensor operator, which calls the op (torch 2.13.0 torch/_tensor.py:29-43, "
        ":1106-1126); the last frame outside torch, /w/run_nerf_helpers.py:15 <lambda>, `img2mse = lambda x, y : "
        "torch.mean((x - y) ** 2)`, is the expression that used it"
    ) in out


def test_4_a_warning_with_its_header_cut_still_counts(tmp_path, capsys):
    tail = "    return f(*args, **kwargs)\n (Triggered internally at  ../torch/csrc/autograd/python_anomaly_mode.cpp:102.)\n"
    _, out = _doctor(tmp_path, capsys, _WARNING + tail)
    assert "and 1 more such line(s)" in out


# 5. the words `device-side assert` beside a sampling assert's message: the kernel's, not a RuntimeError (holdout18 03)
def test_5_a_sampling_assert_said_device_side_is_one(tmp_path, capsys):
    log = "runs died at `grad_norm: nan` followed by a device-side assert `probability tensor contains either inf, nan or element < 0`.\n"  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert "torch.multinomial (sampling); a CUDA device-side assert (asynchronous))" in out
    assert "a RuntimeError the call raised" not in out


# 6. a world the input only bounds from below places a rank's DP and PP only at that world (holdout21 02)
_GRAD_NAN = ("[rank13]: RuntimeError: Rank 13, node n1, device 5, iteration 1: Unexpected result nan (message='found "
             "NaN in local grad norm for bucket #0 in backward pass before data-parallel communication collective')\n")  # fmt: skip


def test_6_an_inferred_world_s_coordinates_are_said_at_that_world(tmp_path, capsys):
    script = "torchrun --nnodes $NNODES --nproc_per_node 8 pretrain_gpt.py --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2\n"  # fmt: skip
    _, out = _doctor(tmp_path, capsys, _GRAD_NAN, script)
    assert (
        "It is TP 1 / CP 0 (EP 0) at any world size; at world 16, the least the input allows (inferred, see the "
        "layout), it is DP 2 / PP 1: the last pipeline stage (a larger world moves those). At that world the last "
        "stage holds the loss"
    ) in out


def test_6_a_given_world_s_coordinates_are_said_flat(tmp_path, capsys):
    script = "torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2\n"  # fmt: skip
    _, out = _doctor(tmp_path, capsys, _GRAD_NAN, script)
    assert "It is TP 1 / CP 0 / DP 2 / PP 1 (EP 0): the last pipeline stage. The last stage holds the loss" in out


# 7. NeMo 0.x (its neural-modules frames, 2019-2020) is no megatron-core job (holdout13 18)
def test_7_nemo_0_frames_are_no_megatron_core_job(tmp_path, capsys):
    log = (
        "[NeMo W 2020-06-05 23:23:22 actions:1580] Loss is NaN or inf. Skipping update.\n"
        "Traceback (most recent call last):\n"
        '  File "/src/NeMo/nemo/core/neural_factory.py", line 340, in train\n    amp_max_loss_scale=amp_max_loss_scale,\n'
        '  File "/src/NeMo/nemo/backends/pytorch/actions.py", line 1561, in train\n    call_chain=curr_call_chain,\n'
        "ValueError: A NMTensor was produced twice in the same DAG.\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["name"] == "nemo-0.x"
    assert "rerun verdict" not in out and "moe-aux-loss" not in out
    assert "it calls nemo" not in out


# 8. DeepSpeed's overflow line means a probe as well as a calibration or a failure (holdout24 07)
def test_8_an_overflow_s_meaning_names_the_probe(tmp_path, capsys):
    log = "[INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 131072, reducing to 65536\n"  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert "mid-run one overflow after a window of clean steps is the scaler probing a higher scale" in out
    assert "later a gradient that overflows fp16 step after step" not in out


# 9. a run's end is at or after the step of a metric line pasted after it (holdout19 07: pdsh's output reordered)
def test_9_a_run_s_end_is_at_or_after_the_metric_line_after_it(tmp_path, capsys):
    log = (
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
        "[INFO] [logging.py:96:log_dist] [Rank 0] step=2100, skipped=2, lr=[0.0003], mom=[(0.9, 0.95)]\n"
    )
    _, out = _doctor(tmp_path, capsys, log)
    assert (
        "and the run ended at or after step 2100 (the metric line after it, line 2: a run ends after its last step's "
        "lines) (line 1;"
    ) in out


# 10. one overflow at a high scale with no step shown: a run's start or a probe later, the text does not say which
# (holdout17 03: the reporter sees it "often")
def test_10_a_stepless_overflow_at_a_high_scale_is_a_start_or_a_probe(tmp_path, capsys):
    log = ("[2023-07-20 04:21:22,215] [INFO] [loss_scaler.py:190:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
           "step. Attempted loss scale: 131072, but hysteresis is 2. Reducing hysteresis to 1\n")  # fmt: skip
    _, out = _doctor(tmp_path, capsys, log)
    assert (
        "no line names its step: at a run's start the scale calibrating, later the scaler probing a higher scale (it "
        "doubles after a window of clean steps), either way not a NaN failure by itself"
    ) in out


# 11. a cumulative skip counter is said where it ended up, and a run whose overflow lines are all at the floor is not
# said to train not at all (holdout19 06: 1586 of 2500 steps skipped, the rest trained)
_STEPS = "[INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped={skipped}, lr=[0.0001371], mom=[(0.9, 0.95)]\n"
_FLOOR = "[INFO] [logging.py:96:log_dist] [Rank 0] Overflow detected. Skipping step. Attempted loss scale: 1, reducing to 1\n"  # fmt: skip


def test_11_a_cumulative_skip_counter_is_said_where_it_ended_up(tmp_path, capsys):
    log = _STEPS.format(step=1, skipped=1) + _FLOOR + _STEPS.format(step=2499, skipped=1585) + _FLOOR
    log += _STEPS.format(step=2500, skipped=1586)
    doc, out = _doctor(tmp_path, capsys, log)
    assert (
        "skip counter: skipped 1 (line 1, cumulative), to 1586 by step 2500 (line 5): 1586 of 2500 steps skipped" in out
    )
    assert doc["metrics"]["counters"][0]["last"] == {"value": 1586, "step": 2500, "line": 5}
    assert "the run does not train" not in out
    assert "how many steps still train, the run's own step counters say" in out


# 12. icefall's Whitening line names the module whose forward input its fp32 metric is computed from (holdout25 19)
def test_12_icefall_s_whitening_metric_names_its_module(tmp_path, capsys):
    log = ("2025-03-09 17:13:39,924 INFO [scaling.py:1024] Whitening: name=encoder.encoders.1.encoder.layers.0.whiten, "
           "num_groups=1, num_channels=256, metric=nan vs. limit=12.0\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["points_to"] == (
        "the forward activations entering encoder.encoders.1.encoder.layers.0.whiten (icefall's Whiten module): its "
        "whitening metric is computed in fp32 from them, so they held inf or NaN (an fp16 activation overflowed to inf "
        "is one) (k2-fsa/icefall 36e0420 egs/librispeech/ASR/zipformer/scaling.py:971-1005, :1019-1031)"
    )


# 13. finite rewards beside a non-finite training loss are rollouts finite weights generated for at least part of the
# report's window (holdout23 10: mlx_lm's GRPO, `Total rewards mean 1.406` beside `Train loss nan`, `KL nan`; round 30:
# a report line is a mean over its window, so not "not the weights")
def test_13_finite_rewards_beside_a_nan_training_loss_clear_the_weights(tmp_path, capsys):
    log = ("Iter 10: Val loss nan, Val total_rewards_mean 0.000, Val kl nan\n"
           "Iter 10: Train loss nan, Total rewards mean 1.406, Total rewards std 1.239, KL nan, Learning Rate 1.000e-05\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["summary"]["points_to"] == (
        "the log-probs the loss is computed from, and KL non-finite beside it (it needs the policy's and the "
        "reference's log-probs), or weights that went non-finite late in the window: the training loss reported at step "
        "10 is non-finite too (line 2: a mean over the steps since the last report), while the rewards reported beside "
        "it are finite (Total rewards mean 1.406): the weights generated finite rollouts for at least part of that window"
    )


def test_13_without_rewards_the_weights_stay_the_reading(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "Iter 10: Val loss nan, Val kl nan\nIter 10: Train loss nan, KL nan\n")
    assert doc["summary"]["points_to"].startswith("the weights, not the evaluation alone")


# 14. rsl-rl's block is one record: its later NaN losses join the first, and no one model is said for several
# (holdout25 09: the value-function loss first in the block's order beside NaN surrogate and AMP losses)
_BLOCK = ("                      Learning iteration 17/50000\n\n"
          "          Mean value_function loss: nan\n"
          "               Mean surrogate loss: nan\n"
          "                 Mean entropy loss: 17.0273\n"
          "                Mean amp_loss loss: nan\n"
          "                       Mean reward: 2.69\n")  # fmt: skip


def test_14_an_rsl_rl_block_is_one_record(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _BLOCK)
    summary = doc["summary"]
    assert (summary["metric"], summary["model"], summary["step"]) == ("Mean value_function loss", None, 17)
    assert summary["also"] == ["Mean surrogate loss", "Mean amp_loss loss"]
    assert "later metric line" not in out and "(the critic" not in out


def test_14_a_block_with_the_critic_s_loss_alone_keeps_the_critic(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _BLOCK.replace("Mean surrogate loss: nan", "Mean surrogate loss: 0.1").replace(
        "Mean amp_loss loss: nan", "Mean amp_loss loss: 0.2"))  # fmt: skip
    assert doc["summary"]["model"] == "critic"


# 15. after a first reading that is a logged statistic only (a KL), the first later non-finite loss or gradient norm is
# said (holdout20 07, 08: TRL's `kl` nan from step 3, `grad_norm` nan at step 14)
def test_15_a_later_nan_gradient_norm_after_a_statistic_is_said(tmp_path, capsys):
    log = ("{'loss': 0.0, 'grad_norm': 0.1259, 'learning_rate': 6e-06, 'reward': 1.02, 'kl': nan, 'epoch': 0.0}\n"
           "{'loss': -0.0, 'grad_norm': nan, 'learning_rate': 1.5e-05, 'reward': 1.03, 'kl': nan, 'epoch': 0.01}\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, log)
    assert "clear no step of the window but the last. A model's own value went non-finite later: grad_norm (line 2): " in out  # fmt: skip
    assert doc["metrics"]["graver_nonfinite"]["values"] == [["grad_norm", "nan"], ["kl", "nan"]]


# 16. LLaMA-Factory's --checkpoint_dir (up to v0.3.3) loads the fine-tuned checkpoints it names (holdout12 19)
def test_16_llama_factory_s_checkpoint_dir_loads_a_checkpoint(tmp_path, capsys):
    script = ("accelerate launch src/train_bash.py --stage rm --model_name_or_path meta-llama/Llama-2-7b-hf --do_train "
              "--finetuning_type lora --checkpoint_dir llama-2-7b-sft --output_dir llama-2-7b-rm --bf16\n")  # fmt: skip
    doc, out = _doctor(tmp_path, capsys, "{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.1}\n", script)
    (found,) = [c for c in doc["candidates"] if c["id"] == "bad-checkpoint-resume"]
    assert found["status"] == "enabled"
    assert "--checkpoint_dir llama-2-7b-sft: the run loads the fine-tuned (LoRA) checkpoints it names" in out
