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


def test_the_harness_s_launch_sh_is_the_world_repro_runs():
    import dataclasses

    from nanscope.facts.args import LOSS_FIELDS
    from nanscope.launch import diagnose
    from nanscope.megatron.model import CASE_LR, TinyQwen3MoE
    from nanscope.megatron.spec import Layout

    diagnosis = diagnose(case.harness_script(), case_release=case.RELEASE)
    cfg, topo = diagnosis.config, diagnosis.topology
    # the layout `nanscope repro` launches: Layout() (TP2 PP2 DP1 EP1) on 1 node x 4, sequence parallel (TP > 1)
    layout = Layout()
    assert (topo.world, topo.nodes, topo.gpus_per_node) == (layout.world, 1, 4) == (4, 1, 4)
    assert (topo.tp, topo.pp, topo.dp, topo.ep, topo.cp) == (layout.tp, layout.pp, layout.dp, layout.ep, 1)
    assert cfg["sequence_parallel"] is True and diagnosis.notes == [] and cfg.undefined == []
    # the model: megatron/model.py's TinyQwen3MoE, field by field, as the script spells it
    sizes = dataclasses.asdict(TinyQwen3MoE())
    spelled = {"num_experts": "--num-experts", "max_sequence_length": "--max-position-embeddings"}
    for name, value in sizes.items():
        (word,) = cfg.given[spelled.get(name, "--" + name.replace("_", "-"))]
        assert float(word) == value, name
    # the loss: the case's flags (slime-795's GRPO_ARGS and ROLLOUT_ARGS), --kl-loss-type low_var_kl among them
    loss = {k: cfg[k] for k in LOSS_FIELDS if k != "global_batch_size" and cfg.origin(k) == SCRIPT}
    assert loss == case.loss_flags() and loss["kl_loss_type"] == "low_var_kl"
    # one rollout group of the case's size a step, one sample per micro-batch (megatron/step.py); Adam's lr
    assert (cfg["global_batch_size"], cfg["micro_batch_size"]) == (case.group_size(), 1)
    assert float(*cfg.given["--lr"]) == CASE_LR and cfg["transformer_impl"] == "local"
