"""Issue 34: `nanscope doctor` on launches of other frameworks: the framework named, never assumed; their layout and
flags; each catalogued cause by that framework's own code at its release (file:line); the causes real reports had;
the metric lines before a failure. Fixtures are written in each report's format (tests/fixtures/launchers, reports),
with the report cited."""

import json
from pathlib import Path

import pytest

from nanscope.cli.main import main

LAUNCHERS = Path(__file__).resolve().parents[1] / "fixtures" / "launchers"
REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"
SLIME_FINDINGS = ("rollout-gpus-unset", "kl-loss-exp-then-clamp", "ratio-exp-then-clip")


pytestmark = pytest.mark.usefixtures("wide_terminal")


def _doctor(tmp_path: Path, capsys, *argv: str) -> tuple[dict, str]:
    out = tmp_path / "d.json"
    code = main(["doctor", *argv, "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text()), " ".join(captured.out.split())


def _status(doc: dict) -> dict:
    return {c["id"]: c["status"] for c in doc["candidates"]}


def _evidence(doc: dict, name: str) -> list[str]:
    return next(c["evidence"] for c in doc["candidates"] if c["id"] == name)


def _not_slime(doc: dict, framework: str) -> None:
    """No slime rule: no finding, no resolved slime config, none of the causes slime is immune to."""
    assert doc["framework"]["name"] == framework
    assert doc["findings"] == [] and doc["config"] is None and doc["slime_release"] is None
    assert not {"singleton-group", "zero-std-group", "empty-loss-mask", "inf-grad-clip"} & set(_status(doc))
    assert f"slime's rules do not apply: the launch is {framework}'s" in doc["verdict"]


def test_verl_megatron_layout_and_its_loss_by_release(tmp_path, capsys):
    """verl-project/verl#6431 and #1197's form: hydra overrides; KL low_var_kl; Qwen3.6 with sequence parallelism."""
    doc, out = _doctor(tmp_path, capsys, str(LAUNCHERS / "verl-megatron.sh"))
    _not_slime(doc, "verl")
    topology = doc["topology"]
    assert (topology["world"], topology["tp"], topology["pp"], topology["cp"], topology["dp"], topology["ep"]) == (
        16,
        4,
        2,
        1,
        2,
        8,
    )
    flags = doc["framework_flags"]
    assert flags["--use-kl-loss"] == "actor_rollout_ref.actor.use_kl_loss=True"
    assert flags["--tensor-model-parallel-size"] == "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4"
    status = _status(doc)
    # the release is not named: verl <= v0.4.0 takes exp first, v0.4.1 on clamps first: undecided, both cited
    assert status["kl-exp-overflow"] == "undecidable"
    assert _evidence(doc, "kl-exp-overflow") == [
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "verl the oldest read .. v0.4.0: verl/trainer/ppo/core_algos.py:594-598 (v0.4.0): kl = ref - logp; exp(kl); "
        "the result clamped to [-10, 10] after",
        "verl v0.4.1 .. the newest read: verl/trainer/ppo/core_algos.py:855-858 (v0.4.1), :2239-2242 (v0.9.0): kl "
        "clamped to [-20, 20] before exp",
        "the release decides it: name it (the image or pip pin in the script)",
    ]
    assert status["sp-new-architecture"] == "enabled"
    assert _evidence(doc, "sp-new-architecture")[:2] == [
        "actor_rollout_ref.actor.megatron.sequence_parallel=True",
        "actor_rollout_ref.model.path=/mnt/models/Qwen3.6-35B-A3B",
    ]
    assert "framework verl, release unknown (python3 -m verl.trainer.main_ppo)" in out


@pytest.mark.parametrize(
    ("pin", "status", "where"),
    [
        ("verl==0.4.0", "enabled", "verl v0.4.0: verl/trainer/ppo/core_algos.py:594-598 (v0.4.0)"),
        ("verl==0.5.0", "ruled-out", "verl v0.5.0: verl/trainer/ppo/core_algos.py:855-858 (v0.4.1)"),
    ],
)
def test_the_release_the_script_names_decides_verl_s_kl(pin, status, where, tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(f"pip install {pin}\n" + (LAUNCHERS / "verl-megatron.sh").read_text())
    doc, _ = _doctor(tmp_path, capsys, str(script))
    assert doc["framework"]["release"] == "v" + pin.split("==")[1]
    assert _status(doc)["kl-exp-overflow"] == status
    assert _evidence(doc, "kl-exp-overflow")[-1].startswith(where)


def test_verl_micro_batch_larger_than_a_gpu_s_share_divides_by_zero(tmp_path, capsys):
    """verl-project/verl#2505: gradient_accumulation = ppo_mini_batch_size // ppo_micro_batch_size_per_gpu = 0."""
    doc, _ = _doctor(
        tmp_path, capsys, str(LAUNCHERS / "verl-fsdp-microbatch.sh"), "--traceback", str(REPORTS / "verl-2505.log")
    )
    assert _status(doc)["empty-micro-batch"] == "enabled"
    assert _evidence(doc, "empty-micro-batch")[:2] == [
        "ppo_mini_batch_size 4 x rollout.n 5 / 4 GPUs = 5 per GPU < ppo_micro_batch_size_per_gpu 8: gradient_accumulation 0",
        "verl v0.4.1 verl/workers/actor/dp_actor.py:420",
    ]
    excursions = {e["metric"]: (e["step"], e["value"]) for e in doc["metrics"]["excursions"]}
    assert excursions == {"grad_norm": (1, "nan"), "loss": (1, "nan"), "kl": (2, "nan"), "entropy": (2, "nan")}


def test_megatron_lm_torchrun_pretrain_gpt(tmp_path, capsys):
    """NVIDIA/Megatron-LM#2301's form: data parallel only, --overlap-grad-reduce, resumed with --load."""
    doc, _ = _doctor(tmp_path, capsys, str(LAUNCHERS / "megatron-lm-dp.sh"))
    _not_slime(doc, "megatron-lm")
    assert (doc["topology"]["world"], doc["topology"]["dp"]) == (8, 8)  # torchrun --nproc_per_node 8 --nnodes 1
    status = _status(doc)
    assert status["grad-reduce-overlap-race"] == "enabled"
    assert _evidence(doc, "grad-reduce-overlap-race")[0] == "--overlap-grad-reduce"
    for name in ("kl-exp-overflow", "ratio-exp-overflow", "nan-reward"):  # pretraining: no RL loss, no rollouts
        assert status[name] == "ruled-out", name


def test_a_megatron_lm_script_as_python3_pretrain_gpt_is_never_read_with_slime_s_rules(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, str(LAUNCHERS / "megatron-lm-as-python.sh"))
    _not_slime(doc, "megatron-lm")
    assert not any(finding["id"] in SLIME_FINDINGS for finding in doc["findings"])
    assert _status(doc)["ratio-exp-overflow"] == "ruled-out"
    assert _status(doc)["cp-rank-all-masked"] == "enabled"  # CP 2 on megatron-core <= 0.15 (release not known)
    assert _evidence(doc, "cp-rank-all-masked")[1] == (
        "megatron-core 0.15.0rc0 pipeline_parallel/schedules.py:236: output_tensor /= num_tokens, unclamped"
    )


def test_openrlhf_k3_takes_exp_before_its_clamp(tmp_path, capsys):
    """OpenRLHF/OpenRLHF#1120's form: --use_kl_loss --kl_estimator k3 on v0.9.0 (the script pins it)."""
    doc, _ = _doctor(tmp_path, capsys, str(LAUNCHERS / "openrlhf-grpo.sh"))
    _not_slime(doc, "openrlhf")
    assert doc["topology"] is None  # DeepSpeed's ranks
    status = _status(doc)
    assert (status["kl-exp-overflow"], status["ratio-exp-overflow"], status["moe-aux-loss"]) == (
        "enabled",
        "enabled",
        "ruled-out",
    )
    assert _evidence(doc, "kl-exp-overflow") == [
        "--use_kl_loss",
        "--kl_estimator k3",
        "openrlhf v0.9.0: openrlhf/models/utils.py:35-38 (v0.7.0: never clamped), :35-40 (v0.9.0), :88-95 "
        "(v0.11.0): k3 = exp(-log_ratio) - 1 + log_ratio first, the clamp to [-10, 10] after",
    ]
    assert _evidence(doc, "ratio-exp-overflow")[-1].startswith("openrlhf v0.9.0: openrlhf/models/loss.py:123-124")


def test_ms_swift_megatron_sft(tmp_path, capsys):
    """modelscope/ms-swift#8435's form: NPROC_PER_NODE/NNODES before `megatron sft`, underscores, optimizer offload."""
    doc, _ = _doctor(tmp_path, capsys, str(LAUNCHERS / "ms-swift-megatron-sft.sh"))
    _not_slime(doc, "ms-swift")
    topology = doc["topology"]
    assert (topology["world"], topology["tp"], topology["pp"], topology["ep"], topology["dp"]) == (16, 2, 2, 4, 4)
    status = _status(doc)
    assert (status["cpu-offloaded-optimizer"], status["sp-new-architecture"]) == ("enabled", "enabled")
    assert _evidence(doc, "cpu-offloaded-optimizer")[:2] == [
        "--optimizer_cpu_offload true",
        "--use_precision_aware_optimizer true",
    ]
    # `megatron sft` fine-tunes: no rollouts, rewards or rollout log-probs (issue 41, third round's class f)
    assert status["kl-exp-overflow"] == "ruled-out"
    assert _evidence(doc, "kl-exp-overflow") == [
        "the entry point megatron sft: supervised fine-tuning (no rollouts or rewards)"
    ]


def test_pai_megatron_patch_wrapper_with_positional_arguments(tmp_path, capsys):
    """alibaba/Pai-Megatron-Patch#366: `sh run_pretrain_llama.sh dsw 70B 1 128 bf16 4 8 true` is followed, with its
    arguments as $1..$8; the traceback's rank 21 is placed in TP4 PP8 over 4 nodes."""
    doc, _ = _doctor(
        tmp_path,
        capsys,
        str(LAUNCHERS / "pai" / "pretrain_llama3_70B.sh"),
        "--traceback",
        str(REPORTS / "pai-366.txt"),
    )
    _not_slime(doc, "pai-megatron-patch")
    assert (doc["topology"]["world"], doc["topology"]["tp"], doc["topology"]["pp"]) == (32, 4, 8)
    rank = doc["failing_rank"]
    assert (rank["rank"], rank["tp"], rank["pp"], rank["dp"]) == (21, 1, 5, 0)
    status = _status(doc)
    assert status["non-flash-attention-mask-pp"] == "enabled"  # PP 8 with --attention-backend unfused
    assert _evidence(doc, "non-flash-attention-mask-pp")[:2] == ["PP 8", "--attention-backend unfused"]
    assert doc["inputs"]["sources"][0]["status"] == "followed"


@pytest.mark.parametrize(
    ("script", "framework", "how"),
    [
        ("nemo-llm.sh", "nemo", "the `nemo llm` command"),
        ("roll-rlvr.sh", "roll", "the script examples/start_rlvr_pipeline.py"),
    ],
)
def test_nemo_and_roll_are_named(script, framework, how, tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, str(LAUNCHERS / script))
    _not_slime(doc, framework)
    assert doc["framework"]["how"] == how
    # ROLL trains with rollouts: its loss's causes are weighed; a NeMo LLM pretraining recipe has none (round 2)
    assert _status(doc).get("kl-exp-overflow") == ("undecidable" if framework == "roll" else None)


def test_nemo_resume_is_a_checkpoint_cause(tmp_path, capsys):
    """NVIDIA-NeMo/Speech#14751: Inf before the first step, only with nemo_resume."""
    doc, _ = _doctor(tmp_path, capsys, str(LAUNCHERS / "nemo-llm.sh"), "--traceback", str(REPORTS / "nemo-14751.log"))
    assert _status(doc)["bad-checkpoint-resume"] == "enabled"
    assert _evidence(doc, "bad-checkpoint-resume")[0] == (
        "resume.restore_config.path=nvidia/NVIDIA-Nemotron-Nano-12B-v2-Base: the run loads weights (NeMo's "
        "restore_config: the optimizer state only where load_optim_state is set)"
    )
    assert doc["failure"]["check"] == "grad-norm-inf" and doc["failing_rank"]["rank"] == 6


def test_metric_lines_are_warning_signs(tmp_path, capsys):
    """THUDM/slime#2073: grad norm 1.5e7 and a train-rollout log-prob gap of 9.25 at step 0, then the NaN."""
    doc, out = _doctor(tmp_path, capsys, "--traceback", str(REPORTS / "slime-2073.log"))
    excursions = {e["metric"]: (e["step"], e["value"]) for e in doc["metrics"]["excursions"]}
    assert excursions == {"grad_norm": (0, 15310134.63), "train_rollout_logprob_abs_diff": (0, 9.2473)}
    assert "Its grad_norm left its range at step 0: 1.53101e+07 (past 10000; range: finite, <= 1e4)." in doc["verdict"]
    assert _evidence(doc, "bad-checkpoint-resume")[-2:] == [
        "the metrics: grad_norm left its range at step 0: 1.53101e+07 (past 10000; range: finite, <= 1e4), the first "
        "step logged",
        "the metrics: train_rollout_logprob_abs_diff left its range at step 0: 9.2473 (past 1; range: finite, <= 1 "
        "nat), the first step logged",
    ]
    assert "metric: train_rollout_logprob_abs_diff left its range at step 0: 9.2473" in out


def test_a_log_of_metrics_alone_after_a_checkpoint_load(tmp_path, capsys):
    """THUDM/slime#1695: after a resume the train/rollout log-prob gap leaves its range; no error line."""
    doc, _ = _doctor(tmp_path, capsys, "--traceback", str(REPORTS / "slime-1695.log"))
    assert doc["failure"]["format"] is None and doc["metrics"]["checkpoint_load_line"] == 3
    assert [(e["metric"], e["step"]) for e in doc["metrics"]["excursions"]] == [("train_rollout_logprob_abs_diff", 121)]
    assert doc["verdict"].startswith(
        "No error line in the log names a NaN or an Inf: only its metric lines say what happened."
    )
    assert _evidence(doc, "bad-checkpoint-resume")[-1].endswith("after the checkpoint load the log names at line 3")


def test_the_case_keeps_its_diagnosis_and_ranking(tmp_path, capsys):
    doc, _ = _doctor(tmp_path, capsys, "--case", "slime-795")
    assert doc["framework"] == {
        "name": "slime",
        "release": "v0.1.0",
        "how": "frames under slime/backends/ (actor.py:258 train); its frames actor.py:258 train, model.py:431 train, "
        "model.py:310 train_one_step are slime v0.1.0's lines; the launch script runs deepresearch/train.py with "
        "slime's flags",
        "stack": None,
    }
    enabled = [c["id"] for c in doc["candidates"] if c["status"] == "enabled"]
    assert enabled == [
        "kl-exp-overflow",
        "ratio-exp-overflow",
        "nan-rollout-logprob",
        "nan-reward",
        "logprob-drift",
        "bad-checkpoint-resume",
        "cpu-offloaded-optimizer",
    ]
