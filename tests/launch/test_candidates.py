"""The differential: each catalogued cause ruled out, enabled or undecidable by the flags, with a discriminator."""

import pytest

from nanscope import case
from nanscope.causes import catalogue, immune, reported
from nanscope.launch.candidates import ENABLED, RULED_OUT, STATUSES, UNDECIDABLE, candidates, remaining
from nanscope.launch.config import resolve
from tests.launch.test_findings import CASE_FLAGS


def _by_id(argv, traceback=None):
    return {c.id: c for c in candidates(resolve(argv), traceback)}


def _flags(**replace):
    """CASE_FLAGS with flags replaced or added (`value` None drops the flag, True writes it bare)."""
    argv = list(CASE_FLAGS)
    for name, value in replace.items():
        flag = "--" + name.replace("_", "-")
        if flag in argv:
            i = argv.index(flag)
            del argv[i : i + (1 if i + 1 == len(argv) or argv[i + 1].startswith("--") else 2)]
        if value is not None:
            argv += [flag] + ([] if value is True else [str(value)])
    return argv


def test_case_with_its_traceback():
    cands = candidates(case.config(), case.traceback())
    status = {c.id: c.status for c in cands}
    assert status == {
        "kl-exp-overflow": ENABLED,
        "ratio-exp-overflow": ENABLED,
        "nan-rollout-logprob": ENABLED,
        "nan-reward": ENABLED,
        "activation-overflow": UNDECIDABLE,
        "backward-only-fault": UNDECIDABLE,
        "transient-fault": UNDECIDABLE,
        "logprob-drift": ENABLED,
        # the model-args file was not shared: the flags that decide them are unknown (tests/launch/test_moe.py)
        "moe-aux-loss": UNDECIDABLE,
        "moe-zero-token-expert": UNDECIDABLE,
        "moe-router-logits": UNDECIDABLE,
        "zero-temperature": RULED_OUT,
        "rollout-logprob-shift": RULED_OUT,
        "singleton-group": RULED_OUT,
        "zero-std-group": RULED_OUT,
        "empty-loss-mask": RULED_OUT,
        "inf-grad-clip": RULED_OUT,
        # issue 34: the causes real reports had (causes.reported), weighed by the same flags
        "grad-reduce-overlap-race": RULED_OUT,  # no --overlap-grad-reduce, no --tp-comm-overlap
        "library-regression": UNDECIDABLE,
        "bad-checkpoint-resume": ENABLED,  # --load
        "cpu-offloaded-optimizer": ENABLED,  # --optimizer-cpu-offload --use-precision-aware-optimizer
        "cp-rank-all-masked": RULED_OUT,  # CP 2, but slime's loss clamps each sample's token count
        "empty-micro-batch": RULED_OUT,
        "non-flash-attention-mask-pp": RULED_OUT,  # PP 4 with --attention-backend flash
        "sp-new-architecture": UNDECIDABLE,  # --sequence-parallel; the model-args file was not read
        "fp8-fp4-recipe": RULED_OUT,
    }
    assert [c.status for c in cands] == sorted((c.status for c in cands), key=STATUSES.index)
    # the case keeps its ranking: its loss-numerics causes first among those its flags enable
    assert [c.id for c in cands if c.status == ENABLED][:5] == [
        "kl-exp-overflow",
        "ratio-exp-overflow",
        "nan-rollout-logprob",
        "nan-reward",
        "logprob-drift",
    ]
    by_id = {c.id: c for c in cands}
    assert by_id["kl-exp-overflow"].evidence == [
        "--use-kl-loss",
        "--kl-loss-type low_var_kl: exp before the clamp",
        "--kl-loss-coef 0 (the term stays in the graph at coefficient 0)",
    ]
    assert "64 x 8 / 512 = 1 optimizer step per rollout" in by_id["ratio-exp-overflow"].evidence[-1]
    assert by_id["zero-temperature"].evidence == ["--rollout-temperature 0.8: not 0"]
    assert by_id["rollout-logprob-shift"].evidence[-1].startswith("the traceback's check found NaN in a gradient")
    assert by_id["singleton-group"].evidence[1:] == [
        "slime/utils/arguments.py:996 (slime v0.1.0)",
        "slime/ray/buffer.py:93 (slime v0.1.0)",
    ]


def test_every_candidate_not_ruled_out_names_its_discriminator():
    cands = candidates(case.config(), case.traceback())
    for c in cands:
        assert (c.discriminator is None) == (c.status == RULED_OUT), c.id
    assert [c.id for c in remaining(cands)] == [
        "kl-exp-overflow",
        "ratio-exp-overflow",
        "nan-rollout-logprob",
        "nan-reward",
        "logprob-drift",
        "bad-checkpoint-resume",
        "cpu-offloaded-optimizer",
        "activation-overflow",
        "backward-only-fault",
        "transient-fault",
        "moe-aux-loss",
        "moe-zero-token-expert",
        "moe-router-logits",
        "library-regression",
        "sp-new-architecture",
    ]
    assert set(cands[0].to_dict()) == {"id", "status", "evidence", "discriminator", "class"}


def test_every_hazard_and_immune_cause_is_a_candidate():
    ids = {c.id for c in candidates(case.config())}
    named = {h.name for h in catalogue.CATALOGUE} - {"healthy"}
    assert ids == named | {c.name for c in immune.IMMUNE} | {c.name for c in reported.REPORTED}


def test_without_a_traceback_a_finite_gradient_hazard_keeps_its_flag_status():
    assert _by_id(CASE_FLAGS)["rollout-logprob-shift"].status == ENABLED


def test_zero_temperature_is_enabled_by_its_flag():
    c = _by_id(_flags(rollout_temperature=0))["zero-temperature"]
    assert (c.status, c.evidence) == (ENABLED, ["--rollout-temperature 0: the logits are divided by 0"])
    assert c.discriminator == catalogue.ZERO_TEMPERATURE.discriminator


@pytest.mark.parametrize(
    "replace, ruled_out, evidence",
    [
        ({"use_kl_loss": None}, "kl-exp-overflow", "(no --use-kl-loss): slime computes no KL term"),
        ({"kl_loss_type": "k2"}, "kl-exp-overflow", "--kl-loss-type k2: no exp in the KL estimator"),
        ({"use_tis": None}, "nan-rollout-logprob", "(no --use-tis): slime v0.1.0's loss never reads rollout_log_probs"),
        (
            {"custom_rm_path": None, "rm_type": "math"},
            "nan-reward",
            "--rm-type math: slime's built-in rule-based reward returns finite values",
        ),
    ],
)
def test_a_flag_rules_a_cause_out(replace, ruled_out, evidence):
    c = _by_id(_flags(**replace))[ruled_out]
    assert (c.status, c.evidence, c.discriminator) == (RULED_OUT, [evidence], None)


def test_remote_reward_model_is_undecidable():
    c = _by_id(_flags(custom_rm_path=None, rm_type="boxed_remote_rm"))["nan-reward"]
    assert (c.status, c.evidence) == (
        UNDECIDABLE,
        ["--rm-type boxed_remote_rm: the remote reward model's JSON may hold NaN"],
    )


def test_the_nanscope_loss_rules_out_what_it_fixes_but_not_zero_temperature():
    argv = CASE_FLAGS + [
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "nanscope.slime_plugin.policy_loss",
        "--rollout-temperature",
        "0",
    ]
    found = _by_id(argv)
    for name in ("kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward"):
        assert found[name].status == RULED_OUT and "(`nanscope hazards --loss safe`)" in found[name].evidence[-1]
    assert found["zero-temperature"].status == ENABLED  # the safe loss still divides by 0


def test_an_unknown_custom_loss_is_undecidable():
    argv = CASE_FLAGS + ["--loss-type", "custom_loss", "--custom-loss-function-path", "team.loss.fn"]
    c = _by_id(argv)["kl-exp-overflow"]
    assert (c.status, c.evidence[:2]) == (
        UNDECIDABLE,
        ["--loss-type custom_loss", "--custom-loss-function-path team.loss.fn"],
    )


def test_fp16_is_noted_for_model_faults():
    evidence = _by_id(CASE_FLAGS + ["--fp16"])["activation-overflow"].evidence
    assert evidence[-1] == "--fp16: an activation past 65504 is inf"


def test_doctor_json_lists_the_candidates_and_the_verdict_keeps_them_open(tmp_path, capsys):
    import json

    from nanscope.cli.main import main

    path = tmp_path / "d.json"
    assert main(["doctor", "--case", "slime-795", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    cands = {c["id"]: c for c in doc["candidates"]}
    assert len(cands) == 26 and all(
        set(c) == {"id", "status", "evidence", "discriminator", "class"} for c in cands.values()
    )
    assert all(c["status"] in STATUSES and c["evidence"] for c in cands.values())
    assert all((c["discriminator"] is None) == (c["status"] == RULED_OUT) for c in cands.values())
    assert doc["verdict"].endswith(
        "15 catalogued causes remain (kl-exp-overflow, ratio-exp-overflow, nan-rollout-logprob, nan-reward, "
        "logprob-drift, bad-checkpoint-resume, cpu-offloaded-optimizer enabled by these flags; activation-overflow, "
        "backward-only-fault, transient-fault, moe-aux-loss, moe-zero-token-expert, moe-router-logits, "
        "library-regression, sp-new-architecture not decidable from flags), so the flags alone do not say which one "
        "fired: each candidate below names the one observation that tells it apart."
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "candidate causes (26: every cause nanscope catalogues)" in out
    assert "undecidable activation-overflow [model-forward]" in out


def _release(release: str, *argv: str) -> dict:
    return {c.id: c for c in candidates(resolve(list(argv), release=release))}


def test_rollout_log_prob_routes_per_release():
    no_route = "(no --use-tis), (no --get-mismatch-metrics), (no --use-rollout-logprobs)"
    c = _release("v0.2.4", "--rollout-batch-size", "1")["nan-rollout-logprob"]
    assert (c.status, c.evidence) == (
        RULED_OUT,
        [
            f"{no_route}: slime v0.2.4's loss reads rollout_log_probs only into a detached metric (train_rollout_logprob_abs_diff)"
        ],
    )
    c = _release("main", "--get-mismatch-metrics", "--use-rollout-logprobs")["nan-rollout-logprob"]
    assert (c.status, c.evidence) == (
        ENABLED,
        [
            "--get-mismatch-metrics: slime main applies the TIS weight clamp(exp(old - rollout)), which passes NaN",
            "--use-rollout-logprobs: a NaN rollout log-prob is the ratio's old log-prob",
            "rollout log-probs from SGLang",
        ],
    )


def test_a_shifted_rollout_log_prob_as_the_old_policy_is_not_ruled_out_by_a_nan_gradient():
    cands = {c.id: c for c in candidates(resolve(["--use-rollout-logprobs"], release="v0.3.1"), case.traceback())}
    assert cands["rollout-logprob-shift"].status == ENABLED
    assert cands["rollout-logprob-shift"].evidence == [
        "--use-rollout-logprobs: misaligned rollout log-probs are the ratio's old log-probs",
        "rollout log-probs from SGLang",
    ]


def test_the_release_s_kl_default_rules_the_kl_hazard_out():
    c = _release("v0.2.4", "--use-kl-loss")["kl-exp-overflow"]
    assert (c.status, c.evidence) == (
        RULED_OUT,
        ["--kl-loss-type k1 (slime v0.2.4's default): no exp in the KL estimator"],
    )
    assert _release("v0.2.4", "--use-kl-loss")["singleton-group"].evidence[0].startswith("slime v0.2.4 is immune: ")
