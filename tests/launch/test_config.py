"""Resolved configuration: defaults, origins, slime's post-parse rules, derived batch figures."""

import pytest

from nanscope import case
from nanscope.errors import UserError
from nanscope.facts.args import LOSS_DEFAULTS
from nanscope.facts.flags import MEGATRON, SCRIPT, SLIME
from nanscope.launch.config import batches, resolve, split_flags


def test_split_flags_last_wins_and_equals_form():
    assert split_flags(["--a", "1", "--b", "--c=x", "--a", "2", "3"]) == {"--a": ["2", "3"], "--b": [], "--c": ["x"]}


def test_defaults_match_slime_args_module():
    cfg = resolve(["--rollout-batch-size", "4"])
    for name in (
        "eps_clip",
        "use_kl_loss",
        "kl_loss_coef",
        "kl_loss_type",
        "entropy_coef",
        "use_tis",
        "tis_clip",
        "tis_clip_low",
        "n_samples_per_prompt",
        "check_for_nan_in_loss_and_grad",
        "loss_type",
    ):
        assert cfg[name] == LOSS_DEFAULTS[name], name
    assert cfg.origin("tis_clip") == SLIME and cfg.origin("check_for_nan_in_loss_and_grad") == MEGATRON


def test_eps_clip_high_defaults_to_eps_clip():
    cfg = resolve(["--eps-clip", "0.3"])
    assert cfg["eps_clip_high"] == 0.3 and cfg.origin("eps_clip_high").startswith("derived")


def test_case_loss_flags_resolve_like_slime_args():
    argv = [
        "--advantage-estimator",
        "grpo",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.00",
        "--kl-loss-type",
        "low_var_kl",
        "--entropy-coef",
        "0.00",
        "--eps-clip",
        "0.2",
        "--eps-clip-high",
        "0.28",
        "--use-tis",
        "--rollout-temperature",
        "0.8",
        "--n-samples-per-prompt",
        "8",
    ]
    cfg = resolve(argv)
    for name, value in case.loss_flags().items():
        assert cfg[name] == value, name
        assert cfg.origin(name) == SCRIPT


def test_no_check_for_nan_flag_and_rerun_mode():
    cfg = resolve(["--no-check-for-nan-in-loss-and-grad", "--rerun-mode", "validate_results"])
    assert cfg["check_for_nan_in_loss_and_grad"] is False
    assert cfg["rerun_mode_effective"] == "disabled"
    assert cfg.notes == [
        "--rerun-mode validate_results has no effect under slime v0.1.0 "
        "(the rerun state machine is never initialised: mode disabled)"
    ]


def test_model_json_fills_missing_flags_and_flags_win():
    cfg = resolve(["--num-layers", "36"], {"num_layers": 94, "num_experts": 128}, "model.json")
    assert (cfg["num_layers"], cfg.origin("num_layers")) == (36, SCRIPT)
    assert (cfg["num_experts"], cfg.origin("num_experts")) == (128, "model.json")


def test_colocate_overrides_rollout_gpus():
    cfg = resolve(["--colocate", "--actor-num-nodes", "2", "--rollout-num-gpus", "8"])
    assert cfg["rollout_num_gpus"] == 16 and cfg["offload"] is True  # 2 nodes x 8 default GPUs
    assert cfg.notes[0] == "--colocate: slime overrides --rollout-num-gpus 8 with the actor GPUs (16)"


def test_etp_defaults_to_tp():
    cfg = resolve(["--tensor-model-parallel-size", "4"])
    assert cfg["expert_tensor_parallel_size"] == 4


def test_a_value_that_reads_unset_variables_is_unknown_not_wrong():
    """Issue 33: the default stands in, and the origin says why; a word that is not a number is still refused."""
    cfg = resolve(["--actor-num-nodes", "$((NODES))", "--rollout-batch-size", "$RBS"], unset={"TOTAL_NODES": 25})
    assert cfg.unknown == {"actor_num_nodes": "$((NODES))", "rollout_batch_size": "$RBS"}
    assert cfg.values["actor_num_nodes"].value == 1 and cfg["rollout_batch_size"] is None
    assert cfg.origin("actor_num_nodes") == (
        "unknown: the script gives '$((NODES))', which reads variables it never sets; the default assumed"
    )
    assert cfg.origin("rollout_batch_size").endswith("; no value assumed")
    with pytest.raises(UserError, match=r"--actor-num-nodes: 'eight' is not an integer$"):
        resolve(["--actor-num-nodes", "eight"], unset={"TOTAL_NODES": 25})


def test_bad_model_json_type():
    with pytest.raises(UserError, match=r"m.json: num_layers: expected int, got '94'"):
        resolve([], {"num_layers": "94"}, "m.json")


def test_case_batches():
    argv = [
        "--rollout-batch-size",
        "64",
        "--n-samples-per-prompt",
        "8",
        "--global-batch-size",
        "512",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "16384",
        "--rollout-max-response-len",
        "61440",
        "--sglang-context-length",
        "65536",
    ]
    b = batches(resolve(argv), dp=2, cp=2)
    # 64 x 8 = 512 samples; / 512 = 1 step; budget 16384 x CP 2 = 32768; longest bounded by sglang 65536
    assert (b.samples_per_rollout, b.steps_per_rollout, b.budget_tokens, b.longest_sample) == (512, 1, 32768, 65536)
    assert b.longest_from == "--sglang-context-length 65536"


def test_batches_derived_global_batch_and_prompt_bound():
    argv = [
        "--rollout-batch-size",
        "8",
        "--n-samples-per-prompt",
        "2",
        "--num-steps-per-rollout",
        "2",
        "--rollout-max-prompt-len",
        "1000",
        "--rollout-max-response-len",
        "3000",
    ]
    b = batches(resolve(argv), dp=2, cp=1)
    assert (b.global_batch, b.steps_per_rollout, b.longest_sample) == (8, 2, 4000)  # 16 / 2; 1000 + 3000
    assert b.budget_tokens is None  # no dynamic batch size


def test_hugging_face_config_names():
    cfg = resolve([], {"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8}, "config.json")
    assert (cfg["num_layers"], cfg["num_experts"], cfg["moe_router_topk"]) == (48, 128, 8)
    assert cfg.origin("num_layers") == "config.json"


def test_a_release_s_defaults_and_the_flags_it_lacks():
    cfg = resolve(["--use-kl-loss", "--use-rollout-logprobs", "--kl-loss-type", "kl"], release="v0.2.4")
    assert (cfg["kl_loss_type"], cfg.origin("kl_loss_type")) == ("kl", SCRIPT)  # as written, but rejected:
    assert cfg.rejected == [("--kl-loss-type", "kl", ("k1", "k2", "k3", "low_var_kl"))]
    assert (cfg.get("use_rollout_logprobs"), cfg.origin("tis_clip"), cfg.undefined) == (
        True,
        "default (slime v0.2.4)",
        [],
    )
    cfg = resolve(["--use-kl-loss"], release="v0.3.1")
    assert (cfg["kl_loss_type"], cfg.origin("kl_loss_type")) == ("k1", "default (slime v0.3.1)")
    cfg = resolve(["--use-rollout-logprobs"])  # v0.1.0: not a flag of its parser
    assert (cfg.undefined, "use_rollout_logprobs" in cfg.values, cfg.get("use_rollout_logprobs")) == (
        ["--use-rollout-logprobs"],
        False,
        False,
    )


def test_no_response_length_default_from_v0_2_4():
    argv = ["--rollout-batch-size", "1", "--rollout-max-prompt-len", "100"]
    b = batches(resolve(argv), dp=1, cp=1)
    assert (b.longest_sample, b.longest_from) == (
        1124,
        "--rollout-max-prompt-len 100 + --rollout-max-response-len 1024",
    )
    b = batches(resolve(argv, release="v0.2.4"), dp=1, cp=1)
    assert (b.longest_sample, b.longest_from) == (
        None,
        "unbounded: no --rollout-max-response-len (slime v0.2.4: no default)",
    )


def test_an_unset_flag_without_a_default_is_said_so_not_none():
    """doctor --case harness said `--rm-type None: slime's built-in rule-based reward returns finite values`."""
    cfg = resolve(["--rollout-temperature", "0.8"])
    assert (cfg["rm_type"], cfg.flag_text("rm_type")) == (None, "(no --rm-type)")
    assert cfg.flag_text("rollout_temperature") == "--rollout-temperature 0.8"
