"""The CPU run's launch of slime's train.py: every case flag kept, resized, dropped or added, with a reason."""

from nanscope import case
from nanscope.slime_train import flags

PATHS = flags.Paths(hf="/w/hf", ref="/w/ref", ckpt="/w/ckpt", rollout="/w/r/{rollout_id}.pt", wandb="/o/wandb",
                    dumps="/o/rollout_data/{rollout_id}.pt")  # fmt: skip


def _value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_case_flag_is_accounted_for_and_none_is_passed_twice():
    given = case.config().given
    plan = flags.launch(given, PATHS)
    dropped = {text.split()[0] for text, _ in plan.dropped} | {
        flag for text, _ in plan.dropped for flag in text.split() if flag.startswith("--sglang-")
    }
    resized = {flag for flag, *_ in plan.resized}
    dropped -= set(flags.MODEL_CPU_IMPOSSIBLE)  # the model-args file's (not shared): said, not in launch.sh
    assert set(given) == set(plan.kept) | dropped | resized  # each case flag in exactly one bucket
    assert not (set(plan.kept) & dropped) and not (set(plan.kept) & resized) and not (dropped & resized)
    flag_tokens = [token for token in plan.argv if token.startswith("--")]
    assert len(flag_tokens) == len(set(flag_tokens)), "a flag passed twice"
    assert all(why for _, why in plan.dropped + plan.added) and all(r[3] for r in plan.resized)


def test_the_cpu_impossible_flags_are_dropped_first_and_named_with_the_call():
    plan = flags.launch(case.config().given, PATHS)
    first = [text.split()[0] for text, _ in plan.dropped[:7]]
    assert first == ["--colocate", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                     "--use-precision-aware-optimizer", "--attention-backend", "--moe-grouped-gemm",
                     "--moe-permute-fusion"]  # fmt: skip
    why = dict(plan.dropped)
    assert "FusedAdam" in why["--use-precision-aware-optimizer"] and "torch_memory_saver" in why["--colocate"]
    for flag in first:
        assert flag not in plan.argv


def test_the_case_grpo_loss_and_recompute_flags_pass_as_written_at_a_world_of_4_with_pp_2():
    given = case.config().given
    plan = flags.launch(given, PATHS)
    for flag in ("--advantage-estimator", "--kl-loss-coef", "--kl-loss-type", "--eps-clip", "--eps-clip-high",
                 "--rollout-temperature", "--n-samples-per-prompt", "--recompute-granularity", "--recompute-method",
                 "--recompute-num-layers", "--lr", "--weight-decay"):  # fmt: skip
        assert _value(plan.argv, flag) == given[flag][0], flag
    for flag in ("--use-kl-loss", "--use-tis", "--use-dynamic-batch-size", "--sequence-parallel", "--balance-data"):
        assert flag in plan.argv
    tp, pp = (
        int(_value(plan.argv, "--tensor-model-parallel-size")),
        int(_value(plan.argv, "--pipeline-model-parallel-size")),
    )
    assert tp * pp * int(_value(plan.argv, "--context-parallel-size")) == flags.WORLD and pp > 1
    assert (
        int(_value(plan.argv, "--actor-num-nodes")) * int(_value(plan.argv, "--actor-num-gpus-per-node")) == flags.WORLD
    )
    # one optimizer step per rollout, as the case's 64 x 8 / 512
    rollout = int(_value(plan.argv, "--rollout-batch-size")) * int(_value(plan.argv, "--n-samples-per-prompt"))
    assert rollout == int(_value(plan.argv, "--global-batch-size"))


def test_the_run_trains_from_the_file_without_engines_or_router_and_with_local_layers():
    plan = flags.launch(case.config().given, PATHS)
    assert "--debug-train-only" in plan.argv and _value(plan.argv, "--load-debug-rollout-data") == PATHS.rollout
    assert _value(plan.argv, "--sglang-router-ip") == "127.0.0.1"  # set: slime starts no router
    assert _value(plan.argv, "--transformer-impl") == "local"
    assert _value(plan.argv, "--custom-megatron-init-path") == "nanscope.slime_train.spec.use_spec"
    assert "--spec" not in plan.argv  # Megatron-LM's validate_args refuses --spec for a MoE model
    assert _value(plan.argv, "--ref-load") == PATHS.ref and _value(plan.argv, "--load") == PATHS.ckpt
    assert "--use-wandb" not in plan.argv and "--loss-type" not in plan.argv


def test_the_plugin_lines_are_the_readme_three():
    plan = flags.launch(case.config().given, PATHS, lines=(1, 2, 3))
    assert _value(plan.argv, "--loss-type") == "custom_loss"
    assert _value(plan.argv, "--custom-loss-function-path") == "nanscope.slime_plugin.policy_loss"
    assert (
        _value(plan.argv, "--custom-megatron-before-train-step-hook-path") == "nanscope.slime_plugin.before_train_step"
    )
    assert _value(plan.argv, "--save-debug-rollout-data") == PATHS.dumps
    assert _value(plan.argv, "--wandb-mode") == "offline" and _value(plan.argv, "--wandb-dir") == PATHS.wandb
    sentinel = flags.launch(case.config().given, PATHS, lines=(2, 3))
    assert "--loss-type" not in sentinel.argv and "--custom-megatron-before-train-step-hook-path" in sentinel.argv


def test_the_tiny_model_args_match_the_hf_config_slime_validates():
    from nanscope.slime_train import hf

    argv = flags.model_args()
    config = hf.config(flags.TinyQwen3MoE())
    # slime's hf_validate_args (utils/arguments.py:1039-1054): these pairs must agree
    pairs = {"hidden_size": "--hidden-size", "num_attention_heads": "--num-attention-heads",
             "num_hidden_layers": "--num-layers", "intermediate_size": "--ffn-hidden-size",
             "rms_norm_eps": "--norm-epsilon", "rope_theta": "--rotary-base"}  # fmt: skip
    for hf_name, flag in pairs.items():
        assert float(_value(tuple(argv), flag)) == float(config[hf_name]), flag
    assert config["tie_word_embeddings"] is False and "--untie-embeddings-and-output-weights" in argv
