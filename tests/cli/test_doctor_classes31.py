"""Issue 41, round 31: readings the round-30 re-check still graded wrong or partly, on crafted input of each class;
each positive test fails on 44dc466."""

import pytest

from nanscope.causes import neutral
from nanscope.launch import line_steps
from tests.cli.doctoring import doctor_log as _doctor

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _rsl(iteration: int, value: str, surrogate: str, pad: int = 35) -> str:
    """rsl-rl's OnPolicyRunner block (rsl_rl/runners/on_policy_runner.py:178-188 at ff9e971): a rule, the header
    `Learning iteration {it}/{total}`, then right-aligned `Name: value` lines."""
    return (
        f"{'#' * 80}\n{'Learning iteration ' + str(iteration) + '/1500':^80}\n\n"
        f"{'Computation:':>{pad}} 51234 steps/s (collection: 1.234s, learning 0.456s)\n"
        f"{'Mean value_function loss:':>{pad}} {value}\n{'Mean surrogate loss:':>{pad}} {surrogate}\n"
        f"{'Mean entropy loss:':>{pad}} 17.0273\n{'Mean reward:':>{pad}} 2.69\n"
    )


def _cause(doc: dict, name: str) -> dict:
    """The candidate `name` of doctor's JSON."""
    return next(c for c in doc["candidates"] if c["id"] == name)


_MISSING_MEGATRON = (
    "no launch script: give it to place the failing rank in the layout (its TP/CP/DP/PP/EP coordinates, node and "
    "layers)"
)


# 1. rsl-rl's block names its stack (uncatalogued: framework.stack), whose model reads no tokens: no empty-micro-batch,
# no TP/CP/DP/PP/EP layout asked for, and several models' losses at once point to an input they share (holdout25 09)
def test_1_an_rsl_rl_block_names_its_stack_and_offers_no_token_cause(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _rsl(17, "nan", "nan"))
    assert doc["framework"]["name"] == "unknown"
    assert doc["framework"]["stack"] == "rsl-rl"
    assert (
        "framework unknown (no framework nanscope catalogues; its `Learning iteration N/M` block (line 2), a key a line "
        "under it, is printed by rsl-rl's runner (rsl_rl/runners/on_policy_runner.py:178 at ff9e971))"
    ) in out
    assert "empty-micro-batch" not in [c["id"] for c in doc["candidates"]]
    assert (
        "rsl-rl's PPO trains a policy and its critic on a simulator's observations: its loss divides by no count of "
        "tokens, and nothing in the input points to megatron-core, so neither empty-micro-batch nor megatron-core's "
        "own causes are offered."
    ) in out
    assert doc["missing"] == ["no launch script: give it to read the flags that enable or rule out each cause"]
    assert doc["summary"]["points_to"] == (
        "the actor's and the critic's losses at once: an input they share (the observations, the rewards, the "
        "advantages and returns, the rollout) more than one model's own update"
    )


def test_1_an_rsl_rl_frame_names_its_stack(tmp_path, capsys):
    log = (
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.10/site-packages/rsl_rl/runners/on_policy_runner.py", line 206, in learn\n'
        "    mean_value_loss, mean_surrogate_loss = self.alg.update()\n"
        "ValueError: Expected parameter loc (Tensor of shape (4096, 2)) of distribution Normal(loc: "
        "torch.Size([4096, 2]), scale: torch.Size([4096, 2])) to satisfy the constraint Real(), but found invalid "
        "values:\ntensor([[nan, nan]], device='cuda:0')\n"
    )
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["stack"] == "rsl-rl"
    assert "empty-micro-batch" not in [c["id"] for c in doc["candidates"]]


# 2. guided-diffusion's scaler line names its stack; its forward loss non-finite beside the scaler's overflows is the
# forward's, which no scale explains (holdout25 04)
def test_2_a_forward_loss_beside_a_scalers_overflow_is_no_scales_doing(tmp_path, capsys):
    log = (
        "| loss | nan |\n| mse | nan |\n| step | 1200 |\n"
        "Found NaN, decreased lg_loss_scale to 3.5\nFound NaN, decreased lg_loss_scale to 2.5\n"
    )
    doc, out = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["stack"] == "guided-diffusion"
    assert "empty-micro-batch" not in [c["id"] for c in doc["candidates"]]
    assert (
        "The loss itself is non-finite (loss at line 1): a loss scaler multiplies the loss only for the backward, "
        "after the forward computed it, so the forward pass (its weights or its inputs) was already non-finite there, "
        "and no scale, lowered or raised, explains or cures that."
    ) in out


def test_2_a_gradient_norm_beside_a_scalers_overflow_says_no_forward_loss(tmp_path, capsys):
    log = "| grad_norm | nan |\n| step | 1200 |\nFound NaN, decreased lg_loss_scale to 3.5\n"
    _, out = _doctor(tmp_path, capsys, log)
    assert "The loss itself is non-finite" not in out


# 3. a job without megatron-core is told no TransformerEngine, no RerunStateMachine, no megatron-core schedule and no
# Megatron stack's report; a batch of masked labels is torch's 0/0 (holdout20 08 and the other Trainer jobs)
_GRPO = (
    "  1% 3/300 [01:33<2:24:37, 29.22s/it]\n"
    "{'loss': 0.0, 'grad_norm': 0.157, 'learning_rate': 6e-06, 'reward': 1.59, 'reward_std': 0.41, "
    "'completion_length': 230.1, 'kl': nan, 'epoch': 0.01}\n"
    "  3% 9/300 [03:58<2:06:28, 26.08s/it]\n"
)


def test_3_a_job_without_megatron_core_is_told_its_own_libraries_and_reports(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _GRPO)
    assert doc["framework"]["name"] == "trl"
    by_id = {c["id"]: c for c in doc["candidates"]}
    library = by_id["library-regression"]
    assert library["evidence"] == [
        "no flag decides it: the versions of torch, CUDA and the attention kernels the model calls (flash-attention, "
        "xformers) do",
        "alibaba/ROLL#398 (NaN with torch 2.8 + vLLM 0.10.2, finite with torch 2.6 + vLLM 0.8.4)",
    ]
    assert library["discriminator"] == neutral.LIBRARY_REGRESSION
    assert "RerunStateMachine" not in library["discriminator"]
    assert by_id["empty-micro-batch"]["evidence"][0] == neutral.ALL_MASKED
    assert not any("megatron-core" in line for line in by_id["empty-micro-batch"]["evidence"])
    assert by_id["bad-checkpoint-resume"]["evidence"] == [
        "no launch script: whether the run loads a checkpoint is unknown"
    ]
    assert doc["missing"] == ["no launch script: give it to read the flags that enable or rule out each cause"]


def test_3_a_megatron_job_keeps_megatron_cores_words(tmp_path, capsys):
    log = "Rank 5, node n1, device 5, iteration 7: Unexpected result nan (message='found NaN in local grad norm')\n"
    doc, out = _doctor(tmp_path, capsys, log)
    library = _cause(doc, "library-regression")
    assert library["evidence"][0] == (
        "no flag decides it: the TransformerEngine, flash-attention and torch versions do"
    )
    assert "RerunStateMachine" in library["discriminator"]
    assert doc["missing"][0].startswith(_MISSING_MEGATRON.replace("the failing rank", "rank 5"))


def test_3_a_masked_batch_is_0_over_0_in_torch():
    torch = pytest.importorskip("torch")
    logits = torch.randn(4, 10)
    assert torch.isnan(torch.nn.functional.cross_entropy(logits, torch.full((4,), -100)))  # neutral.ALL_MASKED


# 4. a step said once, with what it bounds: a progress bar's count drawn before a line is a step at or after it, in the
# verdict, the error section, the candidates and the JSON (holdout20 08); the input's first record is at or before
# its step in the error section too (holdout25 04)
def test_4_a_bars_count_before_a_line_is_at_or_after(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, _GRPO)
    assert (doc["summary"]["step"], doc["summary"]["step_bound"]) == (3, "at or after")
    said = "the progress bar drawn before it counts the steps done by then; the line was logged at or after that"
    assert f"The first non-finite metric: kl at or after step 3 (line 2: {said})" in out
    assert f"first non-finite metric line 2, at or after step 3 ({said}): kl nan" in out


def test_4_the_inputs_first_record_is_at_or_before_in_every_section(tmp_path, capsys):
    doc, out = _doctor(tmp_path, capsys, "| loss | nan |\n| step | 1200 |\n")
    assert doc["summary"]["step_bound"] == "at or before"
    assert (
        "first non-finite metric line 1, at or before step 1200 (the line); the input's first record of it, so an "
        "earlier step may have been too: loss nan"
    ) in out


@pytest.mark.parametrize(
    ("step", "how", "opening", "said"),
    [(None, None, False, None), (7, "the line", False, "at"), (7, "the line", True, "at or before"),
     (1, "the line", True, "at"), (3, "the progress bar before it", False, "at or after"),
     (3, "the progress bar before it", True, "at or before")],
)  # fmt: skip
def test_4_what_a_step_bounds(step, how, opening, said):
    assert line_steps.bound(step, how, opening=opening) == said


# 5. TRL's GRPO kl is a logging window's mean and a term of each step's loss: a finite loss and gradient norm on the
# line do not clear the step (trl v0.16.0 grpo_trainer.py:914-931, :956); its loss is about 0 at every step
def test_5_a_grpo_kl_is_a_windows_mean_in_the_steps_loss(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _GRPO)
    points = doc["summary"]["points_to"]
    assert points.startswith(
        "a logged statistic only on the line, maybe more in a step of its window: TRL's GRPO logs its metrics as "
        "means over the logging window's steps (trl v0.16.0 grpo_trainer.py:956)"
    )
    assert "some step of the window had non-finite log-probs, or completions of no token" in points
    assert points.endswith("clear no step of the window but the last")
    assert "not a diverged model" not in points


# 6. a checkpoint load the log names, then a first metric line already non-finite: what bad-checkpoint-resume's
# discriminator looks for, said (holdout20 08)
_LOADED = "[+] Adapter weights loaded, continuing from step 100.\n"


def test_6_a_load_then_a_non_finite_first_metric_line_is_said(tmp_path, capsys):
    nan = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 6e-06, 'epoch': 0.01}\n"
    doc, _ = _doctor(tmp_path, capsys, _LOADED + "  1% 3/300 [01:33<2:24:37, 29.22s/it]\n" + nan)
    evidence = _cause(doc, "bad-checkpoint-resume")["evidence"]
    assert evidence[1] == (
        "the first metric line after it (line 3) is already non-finite, as a bad load makes it; a fresh start from "
        "the same weights would tell"
    )


@pytest.mark.parametrize(
    "after",
    ["{'loss': 0.1, 'grad_norm': 0.2, 'learning_rate': 6e-06, 'kl': 0.001, 'epoch': 0.0}\n" + _GRPO, _GRPO],
    ids=["a finite line first", "a statistic only"],
)
def test_6_a_first_metric_line_after_a_load_finite_or_a_statistic_says_nothing_more(tmp_path, capsys, after):
    doc, _ = _doctor(tmp_path, capsys, _LOADED + after)
    evidence = _cause(doc, "bad-checkpoint-resume")["evidence"]
    assert len(evidence) == 1


# 7. several tracebacks in one input: which one is read, and what the others may be (holdout19 09)
def test_7_several_tracebacks_are_counted(tmp_path, capsys):
    log = (
        " iteration     1093/    2000 | lm loss: 2.607045E+00 | grad norm: 0.037 |\n"
        "Traceback (most recent call last):\n"
        '  File "/w/megatron/core/distributed/grad_buffer.py", line 146, in finish_grad_sync\n'
        "AssertionError: Rank 5: found NaN in local grad norm in backward pass before data-parallel communication "
        "collective. Device: 5, node: n1\n"
        " iteration     1143/    2000 | lm loss: 2.593311E+00 | grad norm: 0.039 |\n"
        "Traceback (most recent call last):\n"
    )
    _, out = _doctor(tmp_path, capsys, log)
    assert (
        "2 tracebacks in the input (starting at lines 2, 6): the one whose error line is line 4 is read; each other "
        "one may be another rank's, the same failure again (after a restart or a resume) or a different error, which "
        "only its own error line says"
    ) in out


def test_7_one_traceback_is_not_counted(tmp_path, capsys):
    log = "Traceback (most recent call last):\nRuntimeError: Function 'LogBackward0' returned nan values in its 0th output.\n"
    _, out = _doctor(tmp_path, capsys, log)
    assert "tracebacks in the input" not in out


# 8. the library versions a log prints at its start (a trainer's banner, `transformers-cli env`) are said for
# library-regression, as printed (holdout20 07, 08, holdout19 14, holdout21 09)
_BANNER = (
    "==((====))==  Unsloth 2026.5.8: Fast Qwen2 patching. Transformers: 4.57.6. vLLM: 0.7.2.\n"
    "O^O/ \\_/ \\    Torch: 2.5.1+cu124. CUDA: 7.5. CUDA Toolkit: 12.4. Triton: 3.1.0\n"
)


def test_8_the_versions_a_log_prints_are_said_for_library_regression(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _BANNER + _GRPO)
    library = _cause(doc, "library-regression")
    assert library["evidence"][1] == (
        "the versions the log prints: transformers 4.57.6 (line 1), vLLM 0.7.2 (line 1), torch 2.5.1+cu124 (line 2), "
        "the CUDA toolkit 12.4 (line 2), triton 3.1.0 (line 2)"
    )


def test_8_which_lines_print_a_version():
    from nanscope.launch.versions import printed

    lines = ["- `transformers` version: 4.36.2", "- PyTorch version (GPU?): 2.1.0+cu121 (True)", "CUDA: 7.5",
             "torch-npu: 2.1", '  File "/x/torch/nn/modules/module.py", line 1501', "pip install deepspeed==0.7.4"]  # fmt: skip
    assert [str(v) for v in printed(lines)] == [
        "transformers 4.36.2 (line 1)", "torch 2.1.0+cu121 (line 2)", "DeepSpeed 0.7.4 (line 6)"
    ]  # fmt: skip


# 9. a native library's error line names no NaN but may say what made one: a negative size asked for is a 32-bit count
# wrapped (PhysX, as Isaac Gym runs it: holdout25 09)
def test_9_a_native_error_lines_negative_size_is_read(tmp_path, capsys):
    physx = (
        "/buildAgent/work/src/gpubroadphase/src/PxgAABBManager.cpp (1048) : invalid parameter : The application "
        "needs to increase PxgDynamicsMemoryConfig::foundLostAggregatePairsCapacity to -2014081303 , otherwise, the "
        "simulation will miss interactions\n"
    )
    _, out = _doctor(tmp_path, capsys, _rsl(17, "nan", "nan") + "\n" + physx)
    assert (
        "native error line 10 (it names no NaN or Inf): /buildAgent/work/src/gpubroadphase/src/PxgAABBManager.cpp "
        "(1048) : invalid parameter : The application needs to increase"
    ) in out
    assert (
        "A native error line (line 10, naming no NaN) asks for a size of -2014081303: a signed 32-bit count wrapped "
        "past 2^31 - 1, so what it counts exploded"
    ) in out


def test_9_a_log_without_a_native_error_line_says_none(tmp_path, capsys):
    _, out = _doctor(tmp_path, capsys, _rsl(17, "nan", "nan"))
    assert "native error line" not in out


# 10. after the blind re-check: a Megatron-LM copy on DeepSpeed (Megatron-DeepSpeed, gpt-neox) divides by
# loss_mask.sum() and has Megatron-LM's layout; mlx-lm's kernels and loss are MLX's; diffusers trains no tokens; verl's
# own reports are verl's
def _empty(doc: dict) -> list[str]:
    return _cause(doc, "empty-micro-batch")["evidence"]


def test_10_a_megatron_copy_divides_by_its_loss_mask_and_has_a_layout(tmp_path, capsys):
    script = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 2 "
              "--fp16 --deepspeed_config=./ds.json --deepspeed\n")  # fmt: skip
    doc, _ = _doctor(tmp_path, capsys, "step 3: loss nan\n", script=script)
    assert doc["framework"]["name"] == "megatron-deepspeed"
    assert _empty(doc)[0] == (
        "a micro-batch of padding only has no tokens to divide by: its loss is the masked sum over loss_mask.sum(), "
        "unclamped (microsoft/Megatron-DeepSpeed 0782d75 pretrain_gpt.py:158-162)"
    )
    assert not any(line.startswith(("megatron-core ", "verl")) for line in _empty(doc))  # no megatron-core, no verl
    library = _cause(doc, "library-regression")["evidence"]
    assert not any(line.startswith(("NVIDIA/Megatron-LM#", "alibaba/Pai-Megatron-Patch#")) for line in library)
    from nanscope.launch.evidence import Framework
    from nanscope.launch.notes import script_adds

    for name in ("megatron-deepspeed", "gpt-neox"):
        said = script_adds(None, Framework(name, None, "its lines"))
        assert said.startswith("no launch script: give it to place the failing rank in the layout")
    assert script_adds(None, Framework("trl", None, "its keys")) == (
        "no launch script: give it to read the flags that enable or rule out each cause"
    )


def test_10_mlx_lms_libraries_and_loss_are_its_own(tmp_path, capsys):
    log = "Iter 10: Val loss nan, Val took 1.2s\nIter 10: Train loss nan, Learning Rate 1.000e-05, It/sec 0.1\n"
    doc, _ = _doctor(tmp_path, capsys, log)
    library = _cause(doc, "library-regression")
    assert library["evidence"][0] == "no flag decides it: the versions of MLX and mlx-lm do"
    assert _empty(doc)[0] == (
        "a batch with no target tokens: mlx-lm's fine-tuning loss is the masked sum over its token count, unclamped "
        "(ml-explore/mlx-lm 00e8dc2 mlx_lm/tuner/trainer.py:70-81; another trainer's loss is its own)"
    )


def test_10_a_transformers_job_is_told_no_verl_report(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _GRPO)
    assert not any(line.startswith(("verl-project/verl#", "verl v")) for line in _empty(doc))


def test_10_a_diffusers_frame_names_a_stack_without_tokens(tmp_path, capsys):
    log = (
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.10/site-packages/diffusers/training_utils.py", line 120, in compute_snr\n'
        "    snr = (alpha / sigma) ** 2\n"
        "ValueError: Loss is NaN: tensor(nan, device='cuda:0')\n"
    )
    doc, _ = _doctor(tmp_path, capsys, log)
    assert doc["framework"]["stack"] == "diffusers"
    assert "empty-micro-batch" not in [c["id"] for c in doc["candidates"]]


# 11. Unsloth's banner prints its release (holdout20 07)
def test_11_unsloths_banner_gives_its_release(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "Unsloth: Will patch your computer to enable 2x faster free finetuning.\n"
                     + _BANNER + _GRPO)  # fmt: skip
    assert (doc["framework"]["name"], doc["framework"]["release"]) == ("unsloth", "2026.5.8")
    assert doc["framework"]["how"].endswith("its banner prints `Unsloth 2026.5.8`")


# 12. grad_buffer.py's finish_grad_sync at line 146 (155) calls start_grad_sync only where overlap_grad_reduce is off
# (NVIDIA/Megatron-LM 53a350eddb grad_buffer.py:145-146, 293e10419f :154-155): the race is ruled out (holdout19 09)
def _assertion(line: int) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "/w/megatron/core/distributed/grad_buffer.py", line {line}, in finish_grad_sync\n'
        "AssertionError: Rank 5: found NaN in local grad norm in backward pass before data-parallel communication "
        "collective. Device: 5, node: n1\n"
    )


def test_12_a_synchronous_bucket_frame_rules_the_overlap_race_out(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _assertion(146))
    race = _cause(doc, "grad-reduce-overlap-race")
    assert race["status"] == "ruled-out"
    assert race["evidence"][0].startswith(
        "the frame grad_buffer.py:146 finish_grad_sync is its call of start_grad_sync under "
        "`if not self.overlap_grad_reduce:`"
    )


def test_12_another_line_of_the_bucket_file_rules_nothing_out(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, _assertion(169))
    race = _cause(doc, "grad-reduce-overlap-race")
    assert race["status"] != "ruled-out"
