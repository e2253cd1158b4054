"""The causes real reports had (causes.reported): each with a status from flags, a discriminator and evidence; and
outside the hazard catalogue, so `nanscope hazards` and `nanscope repro` run what they ran."""

import pytest

from nanscope.causes import catalogue, reported
from nanscope.launch.flagview import FlagView
from nanscope.launch.reported import Context
from nanscope.launch.reported import reported as statuses


def test_each_cause_has_a_discriminator_and_evidence_from_code_or_a_thread():
    for cause in reported.REPORTED:
        assert cause.discriminator and cause.flags and cause.mechanism, cause.name
        assert cause.evidence and all("#" in line or ".py:" in line for line in cause.evidence), cause.name


def test_they_are_not_hazards_repro_runs():
    assert not {cause.name for cause in reported.REPORTED} & set(catalogue.BY_NAME)
    assert [hazard.name for hazard in catalogue.CATALOGUE] == [
        "healthy", "kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward", "zero-temperature",
        "rollout-logprob-shift", "activation-overflow", "backward-only-fault", "transient-fault", "logprob-drift",
        "moe-aux-loss", "moe-zero-token-expert", "moe-router-logits",
    ]  # fmt: skip


def _status(argv: list[str], framework: str = "megatron-lm", pp: int = 1, cp: int = 1, core=None) -> dict:
    context = Context(framework, FlagView.of_argv(argv), pp=pp, cp=cp, core=core)
    return {cause.name: (status, evidence) for cause, status, evidence in statuses(context)}


NEW, OLD = ("0.16.0", "main"), ("0.14.0", "0.15.0")


@pytest.mark.parametrize(
    ("argv", "kwargs", "name", "status"),
    [
        ([], {}, "grad-reduce-overlap-race", "ruled-out"),
        (["--overlap-grad-reduce"], {}, "grad-reduce-overlap-race", "enabled"),
        (["--num-distributed-optimizer-instances", "2"], {}, "grad-reduce-overlap-race", "enabled"),
        (["--overlap-grad-reduce"], {"framework": "openrlhf"}, "grad-reduce-overlap-race", "ruled-out"),
        ([], {}, "library-regression", "undecidable"),
        (["--load", "/ckpt"], {}, "bad-checkpoint-resume", "enabled"),
        ([], {}, "bad-checkpoint-resume", "undecidable"),
        (["--optimizer-cpu-offload"], {}, "cpu-offloaded-optimizer", "enabled"),
        ([], {}, "cpu-offloaded-optimizer", "ruled-out"),
        ([], {"cp": 2}, "cp-rank-all-masked", "enabled"),
        ([], {"cp": 2, "core": OLD}, "cp-rank-all-masked", "enabled"),
        ([], {"cp": 2, "core": NEW}, "cp-rank-all-masked", "ruled-out"),
        ([], {"cp": 2, "framework": "slime"}, "cp-rank-all-masked", "ruled-out"),
        ([], {"cp": 1}, "cp-rank-all-masked", "ruled-out"),
        ([], {}, "empty-micro-batch", "undecidable"),
        ([], {"core": NEW}, "empty-micro-batch", "ruled-out"),
        ([], {"framework": "slime"}, "empty-micro-batch", "ruled-out"),
        (["--attention-backend", "unfused"], {"pp": 2}, "non-flash-attention-mask-pp", "enabled"),
        (["--attention-backend", "flash"], {"pp": 2}, "non-flash-attention-mask-pp", "ruled-out"),
        ([], {"pp": 2}, "non-flash-attention-mask-pp", "undecidable"),
        (["--attention-backend", "unfused"], {"pp": 1}, "non-flash-attention-mask-pp", "ruled-out"),
        (["--sequence-parallel", "--hf-checkpoint", "/m/Qwen3-Next-80B-A3B"], {}, "sp-new-architecture", "enabled"),
        (["--sequence-parallel", "--mtp-num-layers", "1"], {}, "sp-new-architecture", "enabled"),
        (["--sequence-parallel", "--hf-checkpoint", "/m/Qwen3-8B"], {}, "sp-new-architecture", "ruled-out"),
        ([], {}, "sp-new-architecture", "ruled-out"),
        (["--fp8-format", "hybrid"], {}, "fp8-fp4-recipe", "enabled"),
        (["--fp4-format", "e2m1"], {}, "fp8-fp4-recipe", "enabled"),
        ([], {}, "fp8-fp4-recipe", "ruled-out"),
    ],
)
def test_status_from_flags(argv, kwargs, name, status):
    assert _status(argv, **kwargs)[name][0] == status


def test_the_evidence_names_the_flags_and_the_code():
    got = _status(["--overlap-grad-reduce", "--tp-comm-overlap"])["grad-reduce-overlap-race"]
    assert got == (
        "enabled",
        [
            "--overlap-grad-reduce",
            "--tp-comm-overlap",
            "the reduce runs on its own stream while the backward still writes gradients",
        ],
    )
    assert _status([], cp=2, core=NEW)["cp-rank-all-masked"][1] == [
        "CP 2: a CP rank's slice may be all masked, but megatron-core 0.16.0+ clamps the token count to 1 "
        "(schedules.py:262)"
    ]
