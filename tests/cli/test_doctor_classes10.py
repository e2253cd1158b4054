"""Issue 41, round 10: the classes of misreading left on the three consumed sets (holdout8-10) after round 9, each
on crafted input of its class in the stack's own format: the model an error's own words name (1), the policy behind
a sampling assert in an RL run (2), Keras TerminateOnNaN's 0-based batch index (3), a total loss printed before its own non-finite terms (4), a GAN's spelled-out losses (5), TensorFlow's failing check's scope (6), DeepSpeed's pipeline engine line (7), a loop's column of printed scalars (8), a warning in an RL loop's episode (9). Each test fails on round 9's
doctor (main d29ac49)."""

import time

import pytest

from nanscope.launch import failure_models, loop_lines, metric_points, printed_columns, tf_scopes, totals
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


# 1. an error whose message gives each term's value names the model of the terms that are non-finite
# (TimZaman/dotaclient#42, holdout8 07: the PPO optimizer's own guard, `raise ValueError('loss={}, policy_loss={},
# entropy_loss={}, advantage_loss={}'...)`)
_PPO_GUARD = """iteration 12/10000
Traceback (most recent call last):
  File "optimizer.py", line 646, in train
    loss, policy_loss, entropy_loss, advantage_loss))
ValueError: loss=nan, policy_loss=nan, entropy_loss=nan, advantage_loss=0.25
"""


def test_1_an_error_naming_its_terms_names_their_model(tmp_path, capsys):
    """Round 9: the metric `loss`, the model None; its two non-finite terms are the policy's (round 28: the total
    with the others non-finite on the line, none of them first)."""
    doc, out = _doctor(tmp_path, capsys, _PPO_GUARD)
    assert (doc["summary"]["metric"], doc["summary"]["model"]) == ("loss", "policy")
    assert doc["summary"]["also"] == ["policy_loss", "entropy_loss"]
    assert "The first non-finite metric: loss (the policy)" in out


def test_1_critic_terms_name_the_critic_and_mixed_terms_no_model():
    assert failure_models.message_model("critic_loss=nan, vf_explained_var=0.1") == (
        "critic",
        "the error's message names critic_loss non-finite",
    )
    assert failure_models.message_model("policy_loss=nan, value_loss=inf") is None  # two models: no one of them
    assert failure_models.message_model("loss=nan, entropy=nan") is None  # no key names a model
    assert failure_models.message_model(None) is None


# 2. sampling's assert in an RL run: the probabilities sampled from are the policy's (modelscope/ms-swift#8378,
# holdout8 04: `swift rlhf --rlhf_type grpo`, the assert on rank 5 after bar 82/1218)
_ASSERT = (
    "Train:   7%|▋         | 82/1218 [18:06:05<227:39:40, 721.46s/it]/pytorch/aten/src/ATen/native/cuda/"
    "TensorCompare.cu:112: _assert_async_cuda_kernel: block: [0,0,0], thread: [0,0,0] Assertion `probability tensor "
    "contains either `inf`, `nan` or element < 0` failed.\n"
)
_TRL_FRAMES = (
    "[rank3]: Traceback (most recent call last):\n"
    '[rank3]:   File "/env/lib/python3.11/site-packages/trl/trainer/grpo_trainer.py", line 1183, in '
    "_generate_single_turn\n"
    "[rank3]:     prompt_completion_ids = unwrapped_model.generate(\n"
)
_SFT_FRAMES = (
    "[rank3]: Traceback (most recent call last):\n"
    '[rank3]:   File "/env/lib/python3.11/site-packages/transformers/generation/utils.py", line 3297, in _sample\n'
    "[rank3]:     next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)\n"
)


def test_2_sampling_assert_through_an_rl_trainer_is_the_policy(tmp_path, capsys):
    """Round 9: model None (no frame of _FRAME_MODELS; the traceback is cut before the generate call)."""
    doc, out = _doctor(tmp_path, capsys, _ASSERT + _TRL_FRAMES)
    assert (doc["summary"]["rank"], doc["summary"]["model"]) == (3, "policy")
    assert (
        "The model: the policy (its frames pass through an RL trainer (trainer/grpo_trainer.py:1183 "
        "_generate_single_turn): what it samples from while training is its policy's rollout)." in out
    )


def test_2_sampling_assert_without_rl_names_no_model(tmp_path, capsys):
    """A supervised run samples only to evaluate: no model is claimed."""
    doc, out = _doctor(tmp_path, capsys, _ASSERT + _SFT_FRAMES)
    assert doc["summary"]["check"] == "probability-assert" and doc["summary"]["model"] is None
    assert "The model:" not in out


_GRPO_LAUNCH = """NPROC_PER_NODE=8 \\
swift rlhf \\
    --rlhf_type grpo \\
    --model Qwen/Qwen2.5-7B-Instruct \\
    --use_vllm false \\
    --learning_rate 1e-6
"""


def test_2_sampling_assert_in_a_launch_that_is_rl_is_the_policy(tmp_path, capsys):
    """The log alone (the assert, no frame) says no model; the launch script says the run is GRPO."""
    doc, out = _doctor(tmp_path, capsys, _ASSERT, _GRPO_LAUNCH)
    assert doc["summary"]["model"] == "policy"
    assert "The model: the policy (the launch is an RL run (--rlhf_type grpo)" in out


def test_2_rl_path_reader_is_linear_on_a_100kb_line():
    class Frame:
        path, line, function = "a" * 100_000 + "/x.py", 1, "f" * 100_000

    started = time.process_time()
    assert failure_models.sampling_model("probability-assert", [Frame()], None) is None
    assert failure_models.message_model("k" * 100_000 + "=nan") is None
    assert time.process_time() - started < 10


# 3. Keras TerminateOnNaN prints the 0-based index the fit loop passes to on_batch_end, the Progbar the count of
# batches seen: `Batch 3` is the bar's 4/N (holdout10 12, manishsoni1908/Mobilenet-ssd-keras#21: `3/234 ... loss:
# 44.4110` finite, `Batch 3: Invalid loss`, then `4/234 ... loss: inf`)
_KERAS = """Epoch 1/10
  3/234 [..............................] - ETA: 33:37:24 - loss: 44.4110Batch 3: Invalid loss, terminating training
  4/234 [..............................] - ETA: 25:09:00 - loss: inf
"""


def test_3_terminate_on_nan_batch_is_the_bar_s_next_count(tmp_path, capsys):
    """Round 9: "at step 3" for the message and "at step 4" for the bar: two steps for one batch."""
    doc, out = _doctor(tmp_path, capsys, _KERAS)
    assert (doc["failure"]["step"], doc["summary"]["step"]) == (4, 4)
    assert (
        "at step 4 (TerminateOnNaN's `Batch 3`: Keras's 0-based index of the batch within its epoch, the progress "
        "bar's 4/...)" in out
    )
    assert "The first non-finite metric: loss at step 4" in out


# 4. a total printed first with its terms: the first non-finite term went first, the total is their sum
# (ksw0306/ClariNet#7, holdout9 03: train_student.py prints `[Total Loss, KL Loss, Reg Loss, Frame Loss] : {}` with
# np.array(running_loss); maskrcnn_benchmark's MetricLogger, holdout8 10: `loss: nan (nan)  loss_classifier: nan`)
_ARRAY = """Global Step : 67338, [54, 900] [Total Loss, KL Loss, Reg Loss, Frame Loss] : [ 3.1  0.5 2.301  0.3]
Global Step : 67438, [55, 100] [Total Loss, KL Loss, Reg Loss, Frame Loss] : [  nan   nan 2.301   nan]
"""
_TOTAL_ALONE = """Epoch 1/20
  8/500 [..............................] - ETA: 9:01 - loss: 2.1 - rpn_class_loss: 0.12 - mrcnn_mask_loss: 0.41
  9/500 [..............................] - ETA: 9:00 - loss: nan - rpn_class_loss: 0.12 - mrcnn_mask_loss: 0.41
"""


def test_4_a_total_before_its_nonfinite_terms_names_them(tmp_path, capsys):
    """Round 9: "The first non-finite metric: Total Loss" (the sum of the others), its terms unsaid; round 9 named the
    first term printed, which round 28's re-grade found no line supports (one record prints its terms at once): the
    total, with its non-finite terms; a single non-finite term is named."""
    doc, out = _doctor(tmp_path, capsys, _ARRAY)
    assert (doc["summary"]["metric"], doc["summary"]["step"]) == ("Total Loss", 67438)
    assert doc["summary"]["also"] == ["KL Loss", "Frame Loss"]
    assert (
        "The first non-finite metric: Total Loss at step 67438 (line 2), with KL Loss, Frame Loss non-finite in the "
        "same record too (which went first the record does not say)." in out
    )
    doc, out = _doctor(tmp_path, capsys, _ARRAY.replace("[  nan   nan", "[  nan   0.5"))
    assert (doc["summary"]["metric"], doc["summary"]["also"]) == ("Frame Loss", [])


def test_4_a_total_alone_nonfinite_stays_the_total(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _TOTAL_ALONE)
    assert (doc["summary"]["metric"], doc["summary"]["step"]) == ("loss", 9)


def test_4_totals_and_terms():
    pairs = [("loss", "nan"), ("loss (running average)", "nan"), ("loss_classifier", "nan"), ("loss_mask", "nan")]
    assert totals.first_term(pairs) is None  # two terms: none of them first
    assert totals.nonfinite_terms(pairs) == ["loss_classifier", "loss_mask"]
    assert totals.first_term([("total_loss", "nan"), ("grad_norm", "nan")]) is None  # no term: a norm is no loss
    assert totals.first_term([("lm loss", "nan"), ("load_balancing_loss", "nan")]) is None  # lm loss is no total
    assert totals.first_term([]) is None
    assert totals.first_term([("loss", "nan"), ("implicit loss", "nan")]) is None  # one other loss: maybe no term
    assert totals.first_term([("Total Loss", "nan"), ("KL Loss", "nan")]) == "KL Loss"  # a total by name


# 5. a GAN's losses spelled out name their model (zhysora/PSGan-Family#10, holdout10 17: pix2pix-style
# `discrim_loss`, `gen_loss_GAN`, `gen_loss_L1`, one per line under a `progress` line)
_PIX2PIX = """progress  epoch 50  step 602  image/sec 35.7  remaining 0m
discrim_loss nan
gen_loss_GAN 1.16629475e-36
gen_loss_L1 380.16928
"""


def test_5_spelled_out_gan_losses_name_their_model(tmp_path, capsys):
    """Round 9: "discrim_loss (the line names no step)", no model."""
    doc, out = _doctor(tmp_path, capsys, _PIX2PIX)
    assert (doc["summary"]["metric"], doc["summary"]["model"]) == ("discrim_loss", "discriminator")
    assert "The first non-finite metric: discrim_loss (discriminator)" in out
    assert metric_points.model_of(["gen_loss_GAN"], set()) == "generator"
    assert metric_points.model_of(["discrim_loss", "gen_loss_GAN"], set()) is None  # both: neither alone


# 6. TensorFlow's failing numerics check, by the `{{node ...}}` path printed under its InvalidArgumentError, and the
# model its scope names (tensorforce/tensorforce#848, holdout8 18: check_numerics in the policy's optimizer)
_TF_CHECK = (
    "tensorflow.python.framework.errors_impl.InvalidArgumentError:  Invalid gradient: contains inf or nan. : Tensor "
    "had NaN values\n"
    "\t [[{{node agent/StatefulPartitionedCall/agent/cond_1/then/_297/agent/StatefulPartitionedCall/policy_optimizer/"
    "StatefulPartitionedCall/policy_optimizer/VerifyFinite/CheckNumerics}}]] [Op:__inference_observe_4620]\n"
)


def test_6_tf_check_op_and_the_model_its_scope_names(tmp_path, capsys):
    """Round 9: no op, no model."""
    doc, out = _doctor(tmp_path, capsys, _TF_CHECK)
    assert (doc["summary"]["op"], doc["summary"]["model"]) == ("policy_optimizer/VerifyFinite/CheckNumerics", "policy")
    assert "The model: the policy (the failing check's op is in the scope policy_optimizer)." in out


def test_6_a_scope_naming_no_model_names_none():
    assert tf_scopes.check_op("[[{{node loss/VerifyFinite/CheckNumerics}}]]") == "loss/VerifyFinite/CheckNumerics"
    assert tf_scopes.scope_model("loss/VerifyFinite/CheckNumerics") is None
    assert tf_scopes.scope_model("model/vf/VerifyFinite/CheckNumerics") == ("critic", "vf")
    assert tf_scopes.check_op("[[{{node dense/MatMul}}]]") is None  # no numerics check
    started = time.process_time()
    assert tf_scopes.check_op("{{node " + "a/" * 50_000) is None
    assert time.process_time() - started < 10


# 7. DeepSpeed's pipeline engine's own metric line names DeepSpeed (tdrussell/diffusion-pipe#531, holdout10 02:
# PipelineEngine.train_batch prints `steps: N loss: X iter time (s): Y samples/sec: Z` on global rank 0)
_PIPE = """[2026-07-30 09:16:29,681] [INFO] [logging.py:123:log_dist] [Rank 0] step=17, skipped=0, lr=[1e-06], mom=[0.0]
steps: 17 loss: 0.5994 iter time (s): 3.162 samples/sec: 0.316
[2026-07-30 09:16:32,952] [INFO] [logging.py:123:log_dist] [Rank 0] step=18, skipped=0, lr=[1e-06], mom=[0.0]
steps: 18 loss: nan iter time (s): 3.235 samples/sec: 0.309
"""


def test_7_deepspeed_pipeline_engine_line_names_deepspeed(tmp_path, capsys):
    """Round 9: "framework unknown (nothing in the input names a framework)"."""
    doc, out = _doctor(tmp_path, capsys, _PIPE)
    assert doc["framework"]["name"] == "deepspeed"
    assert (doc["summary"]["metric"], doc["summary"]["step"], doc["summary"]["rank"]) == ("loss", 18, None)
    assert "The job is deepspeed's (its metric lines' keys (loss, samples/sec, steps))." in out


# 8. a column of scalar tensors, one printed a line: a loop's `print(loss)` each iteration (lich99/ChatGLM-finetune-
# LoRA#32, holdout9 13: `for i in range(10): ... print(loss.detach().float())`: 3.2207, then nan)
_COLUMN = """tensor(3.2207, device='cuda:0')
tensor(2.9710, device='cuda:0', grad_fn=<NllLossBackward0>)
tensor(nan, device='cuda:0', grad_fn=<NllLossBackward0>)
tensor(nan, device='cuda:0', grad_fn=<NllLossBackward0>)
"""


def test_8_a_column_of_printed_scalars_gives_the_step(tmp_path, capsys):
    """Round 9: a printed tensor at line 3, no step."""
    doc, out = _doctor(tmp_path, capsys, _COLUMN)
    assert (doc["failure"]["check"], doc["failure"]["line"], doc["summary"]["step"]) == ("printed-tensor", 3, 2)
    assert (
        "A printed tensor holds NaN or Inf at step 2 (the 3rd scalar printed one a line from line 1, a loop's value "
        "each iteration, the 2 before it finite: index 2 of a loop counted from 0)" in out
    )


def test_8_a_printed_tensor_alone_or_after_other_lines_is_no_column(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "epoch 3 done\ntensor(nan, device='cuda:0')\n")
    assert doc["failure"]["check"] == "printed-tensor" and doc["summary"]["step"] is None
    doc, out = _doctor(tmp_path, capsys, "start\n" + _COLUMN)
    assert doc["summary"]["step"] == 2 and "at or after index 2 (the column may start before line 2)" in out
    started = time.process_time()
    assert not printed_columns.scalar("tensor(" + "1" * 100_000 + ")")
    assert not printed_columns.scalar("tensor(1," + "x" * 100_000 + ")")
    assert time.process_time() - started < 10


# 9. a Python warning naming NaN just after an RL loop's episode line: the episode is its step, and the warning's
# words, not "a loss or a gradient", say what went NaN (nnaisense/MAX#1, holdout8 13: imagination.py:49's
# warnings.warn("NaN in sampled next states!") after the act logger's `ep: 63` line)
_EPISODE = """11:01:07 | INFO | episode | step_reward. mean: -21670574161920.00 +- 438323323600896.00
11:01:08 | INFO | act | \tep: 63\taverage step return: 41819492609799.95
/data/git/max/imagination.py:49: UserWarning: NaN in sampled next states!
  warnings.warn("NaN in sampled next states!")
"""


def test_9_a_warning_after_an_episode_line_is_in_that_episode(tmp_path, capsys):
    """Round 9: no step, and "The log says a loss or a gradient went NaN or Inf"."""
    doc, out = _doctor(tmp_path, capsys, _EPISODE)
    assert (doc["failure"]["check"], doc["failure"]["step"]) == ("nonfinite-message", 63)
    assert (
        "A UserWarning says a value went NaN or Inf at step 63 (the episode line 1 line(s) before it, line 2: "
        "'ep: 63': in or after episode 63)" in out
    )


def test_9_episode_words_inside_other_words_are_no_episode():
    assert loop_lines._EPISODE.search("\tep: 63\taverage step return: 4.1") is not None
    assert loop_lines._EPISODE.search("Episode 12, reward 3.0") is not None
    assert loop_lines._EPISODE.search("sleep 63 seconds") is None
    assert loop_lines._EPISODE.search("ep 63x") is None
    started = time.process_time()
    assert loop_lines._EPISODE.search(" ep:" + " " * 100_000 + "1x") is None
    assert loop_lines._EPISODE.search(" ep 1" * 20_000 + "x") is None
    assert time.process_time() - started < 10
