"""nanscope.case: the bundled case read from its own files, not typed by hand."""

from nanscope import case
from nanscope.facts.flags import SCRIPT


def test_loss_flags_are_launch_sh_s_grpo_args():
    # launch.sh's GRPO_ARGS and ROLLOUT_ARGS: --advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00
    # --kl-loss-type low_var_kl --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28 --use-tis,
    # --rollout-temperature 0.8 --n-samples-per-prompt 8.
    assert case.loss_flags() == {
        "advantage_estimator": "grpo", "rollout_temperature": 0.8, "eps_clip": 0.2, "eps_clip_high": 0.28,
        "use_kl_loss": True, "kl_loss_coef": 0.0, "kl_loss_type": "low_var_kl", "entropy_coef": 0.0,
        "use_tis": True, "n_samples_per_prompt": 8,
    }  # fmt: skip
    assert all(case.config().origin(k) == SCRIPT for k in case.loss_flags())
    assert (case.temperature(), case.group_size()) == (0.8, 8)


def test_case_args_fill_the_rest_with_slime_defaults():
    args = case.args(global_batch_size=8)
    # not in the script: slime v0.1.0's defaults
    assert (args.tis_clip, args.tis_clip_low, args.kl_coef, args.loss_type) == (2.0, 0.0, 0.0, "policy_loss")
    assert args.global_batch_size == 8 and args.kl_loss_type == "low_var_kl"


def test_frames_and_message_are_the_traceback_s():
    # traceback.txt below slime's train_one_step: megatron-core 0.15.0rc0's frames, outermost first.
    assert case.frames() == (
        ("schedules.py", 2185, "forward_backward_pipelining_without_interleaving"),
        ("finalize_model_grads.py", 422, "finalize_model_grads"),
        ("distributed_data_parallel.py", 588, "finish_grad_sync"),
        ("param_and_grad_buffer.py", 455, "finish_grad_sync"),
        ("param_and_grad_buffer.py", 333, "start_grad_sync"),
        ("param_and_grad_buffer.py", 185, "check_grads"),
        ("rerun_state_machine.py", 505, "validate_result"),
    )
    assert case.nan_check_message() == (
        "Unexpected result nan (message='found NaN in local grad norm for bucket #0 in backward pass "
        "before data-parallel communication collective')"
    )
    assert case.traceback().failure.rank == 50
