"""The MoE causes in doctor's differential: the flags that decide them, read from the script, its sourced model-args
file or --model-args, and what megatron-core 0.15.0rc0's code says about each (launch.moe)."""

import json
import shutil
import warnings
from pathlib import Path

from nanscope.cli.main import main
from nanscope.facts import releases
from nanscope.facts.slime_models import QWEN3_235B_A22B, matching
from nanscope.launch import moe
from nanscope.launch.candidates import ENABLED, RULED_OUT, UNDECIDABLE, candidates
from nanscope.launch.config import resolve
from tests import checkouts

MOE = ("moe-aux-loss", "moe-zero-token-expert", "moe-router-logits")
SLIME_FILE = "scripts/models/qwen3-235B-A22B.sh"
BASE = ["--num-experts", "128", "--moe-router-topk", "8"]


def _slime_model_args(tmp_path) -> Path:
    """slime v0.1.0's own scripts/models/qwen3-235B-A22B.sh, copied from its checkout (tests/checkouts.py)."""
    path = tmp_path / "qwen3-235B-A22B.sh"
    shutil.copy(checkouts.slime_release("v0.1.0") / SLIME_FILE, path)
    return path


def _moe(argv, release=releases.V0_1_0):
    return {c.id: c for c in candidates(resolve(argv, release=release)) if c.id in MOE}


def _doctor(tmp_path, *argv) -> dict:
    path = tmp_path / "d.json"
    assert main(["doctor", "--case", "slime-795", *argv, "--json", str(path)]) == 0
    return {c["id"]: c for c in json.loads(path.read_text())["candidates"]}


def test_the_case_lists_the_three_moe_causes_open_with_the_deciding_flags_and_slime_s_file_assumed(tmp_path, capsys):
    cands = _doctor(tmp_path)
    source = (
        "not in the launch script; line 15 sources scripts/slime_models/Qwen3-235B-A22B-Thinking-2507_model_args.sh, "
        "which was not read (pass --model-args FILE)"
    )
    assumed = "assumed, with slime v0.1.0's own scripts/models/qwen3-235B-A22B.sh for this model (bundled values): "
    for name in MOE:
        c = cands[name]
        assert c["status"] == UNDECIDABLE and c["discriminator"], name
    aux = cands["moe-aux-loss"]
    assert aux["class"] == "model-backward"
    assert aux["evidence"] == [
        "decided by --moe-aux-loss-coeff, --moe-router-load-balancing-type, --moe-z-loss-coeff: " + source,
        assumed + RULED_OUT,
        "assumed: --moe-router-load-balancing-type aux_loss [default (megatron core_v0.15.0rc0)], "
        "--moe-aux-loss-coeff 0 [scripts/models/qwen3-235B-A22B.sh:34]: coefficient 0: router.py:229-231 and "
        ":268-270 return before computing either load-balancing loss, and :434 computes no aux scores",
        "assumed: " + moe.NONE_CHANGES_NOTHING,
        "assumed: (no --moe-z-loss-coeff) [default (megatron core_v0.15.0rc0)]: router.py:343 computes the z-loss "
        "only when it is set",
    ]
    assert cands["moe-router-logits"]["evidence"][:2] == [
        "decided by --moe-router-dtype, --moe-router-load-balancing-type, --fp16: " + source,
        assumed + RULED_OUT,
    ]
    zero = cands["moe-zero-token-expert"]
    assert zero["evidence"][:3] == [
        "decided by --moe-grouped-gemm, --moe-use-legacy-grouped-gemm, --transformer-impl: " + source,
        assumed + UNDECIDABLE,
        "assumed: --moe-grouped-gemm [scripts/models/qwen3-235B-A22B.sh:30]",
    ]
    assert zero["discriminator"] == (
        "the sentinel's report: expert e of layer l received 0 tokens, and its weight gradient is the first "
        "non-finite one (`expert_tokens` for the failing micro-batch)"
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "undecidable moe-aux-loss [model-backward]: decided by --moe-aux-loss-coeff" in out


def test_with_slime_s_own_model_args_file_the_aux_loss_is_ruled_out_citing_router_py(tmp_path):
    cands = _doctor(tmp_path, "--model-args", str(_slime_model_args(tmp_path)))
    aux, zero, logits = (cands[name] for name in MOE)
    assert (aux["status"], aux["discriminator"]) == (RULED_OUT, None)
    assert aux["evidence"] == [
        "--moe-router-load-balancing-type aux_loss [default (megatron core_v0.15.0rc0)], --moe-aux-loss-coeff 0: "
        "coefficient 0: router.py:229-231 and :268-270 return before computing either load-balancing loss, and :434 "
        "computes no aux scores",
        moe.NONE_CHANGES_NOTHING,
        "(no --moe-z-loss-coeff) [default (megatron core_v0.15.0rc0)]: router.py:343 computes the z-loss only when it "
        "is set",
    ]
    assert moe.NONE_CHANGES_NOTHING.startswith("--moe-router-load-balancing-type none changes nothing in megatron")
    assert (logits["status"], logits["evidence"]) == (
        RULED_OUT,
        [
            "--moe-router-dtype fp32: the router's GEMM writes fp32 logits (router.py:79-82, moe_utils.py:931-935) and "
            "top-k's softmax runs in fp32 (moe_utils.py:571, 575): a non-finite logit needs a non-finite hidden state "
            "(activation-overflow)"
        ],
    )
    assert zero["status"] == UNDECIDABLE and zero["evidence"][:2] == [
        "--moe-grouped-gemm",
        "--transformer-impl transformer_engine [default (megatron core_v0.15.0rc0)]: TEGroupedMLP on "
        "TransformerEngine's GroupedLinear (transformer_engine_spec_provider.py:61-78)",
    ]
    assert "gemm.cpp:390-391" in zero["evidence"][2] and zero["evidence"][2].endswith("not this cause on TE 2.6")


def test_the_bundled_values_are_slime_s_file_s_lines(tmp_path):
    lines = _slime_model_args(tmp_path).read_text().splitlines()
    for flag, words, line in QWEN3_235B_A22B.flags:
        assert lines[line - 1].split() == [flag, *words], (flag, line)
    assert matching("scripts/slime_models/Qwen3-235B-A22B-Thinking-2507_model_args.sh") is QWEN3_235B_A22B
    assert matching("scripts/models/qwen3-4B.sh") is None


def test_a_dense_model_rules_every_moe_cause_out():
    for c in _moe([]).values():
        assert (c.status, c.evidence) == (
            RULED_OUT,
            ["(no --num-experts) [default (megatron core_v0.15.0rc0)]: a dense model, no router and no experts"],
        )


def test_a_nonzero_coefficient_computes_the_loss_but_its_gradient_stays_finite():
    c = _moe(BASE + ["--moe-aux-loss-coeff", "1e-3", "--moe-z-loss-coeff", "0"])["moe-aux-loss"]
    assert c.status == RULED_OUT and c.evidence[0] == (
        "--moe-router-load-balancing-type aux_loss [default (megatron core_v0.15.0rc0)], --moe-aux-loss-coeff 0.001: "
        "the aux_loss loss is computed"
    )
    assert c.evidence[1:] == [
        "--moe-z-loss-coeff 0: the z-loss is computed (router.py:343), at 0 too",
        moe._FINITE_GRADIENT,
    ]


def test_load_balancing_type_none_turns_a_nonzero_coefficient_off():
    c = _moe(BASE + ["--moe-router-load-balancing-type", "none", "--moe-aux-loss-coeff", "0.01"])["moe-aux-loss"]
    assert (c.status, c.evidence[0]) == (
        RULED_OUT,
        "--moe-router-load-balancing-type none, --moe-aux-loss-coeff 0.01: get_aux_loss_coeff returns 0 for aux_loss "
        "and seq_aux_loss (router.py:203-216): no load-balancing loss",
    )


def test_fp16_sigmoid_scores_are_enabled_from_v0_2_4_without_expert_parallelism():
    argv = BASE + ["--moe-aux-loss-coeff", "1e-3", "--moe-router-score-function", "sigmoid", "--fp16"]
    later = _moe(argv, releases.V0_2_4)
    assert later["moe-aux-loss"].status == ENABLED and "0 / 0 = NaN" in later["moe-aux-loss"].evidence[-1]
    assert later["moe-router-logits"].status == ENABLED
    assert later["moe-router-logits"].evidence[1] == (
        "--fp16 (slime v0.2.4: args.bf16 = not args.fp16): a logit past 65504 is inf, and the softmax's inf - inf is NaN"
    )
    first = _moe(argv)  # slime v0.1.0 trains in bf16 whatever the flags
    assert first["moe-router-logits"].status == RULED_OUT
    bf16 = first["moe-router-logits"].evidence[0]
    assert bf16.startswith(
        "(no --moe-router-dtype) [default (megatron core_v0.15.0rc0)]: the logits are bf16 (--fp16: slime v0.1.0 "
        "sets args.bf16 = True (slime/backends/megatron_utils/arguments.py:11)"
    )
    with_ep = _moe(argv + ["--expert-model-parallel-size", "16"], releases.V0_2_4)
    assert with_ep["moe-router-logits"].status == RULED_OUT


def test_sinkhorn_exponentiates_the_logits_unshifted():
    c = _moe(BASE + ["--moe-router-load-balancing-type", "sinkhorn"])["moe-router-logits"]
    assert (c.status, c.evidence) == (
        ENABLED,
        [
            "--moe-router-load-balancing-type sinkhorn: exp of the fp32 logits with no max subtracted "
            "(moe_utils.py:131, router.py:191-193): a logit past 88.72 is inf, and inf / inf is NaN"
        ],
    )


def test_grouped_gemm_decides_zero_token_experts():
    assert _moe(BASE)["moe-zero-token-expert"].evidence == [
        "(no --moe-grouped-gemm) [default (megatron core_v0.15.0rc0)]: SequentialMLP runs each expert on its own "
        "rows, and one with 0 tokens multiplies 0 rows: exact zero gradients (experts.py:1076-1089)"
    ]
    legacy = _moe(BASE + ["--moe-grouped-gemm", "--moe-use-legacy-grouped-gemm"])["moe-zero-token-expert"]
    assert legacy.status == ENABLED and "tgale96/grouped_gemm#36" in legacy.evidence[1]


def test_a_script_that_gives_the_flags_decides_even_with_its_model_args_file_unread():
    cfg = resolve(BASE + ["--moe-aux-loss-coeff", "0", "--moe-router-load-balancing-type", "aux_loss"])
    cfg.unread = [("scripts/models/x.sh", 3)]
    status, evidence = moe.aux_loss(cfg)
    assert status == UNDECIDABLE and evidence == [  # --moe-z-loss-coeff may still be in the file
        "decided by --moe-z-loss-coeff: not in the launch script; line 3 sources scripts/models/x.sh, which was not "
        "read (pass --model-args FILE)",
        "nanscope has no slime model-args file of this model to assume",
    ]
    cfg = resolve(BASE + ["--moe-grouped-gemm", "--moe-use-legacy-grouped-gemm", "--transformer-impl", "local"])
    cfg.unread = [("scripts/models/x.sh", 3)]
    assert moe.zero_token_expert(cfg)[0] == ENABLED


def test_a_bad_coefficient_is_one_line(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text("python3 train.py --num-experts 8 --moe-aux-loss-coeff 1e-2 x\n")
    assert main(["doctor", str(script)]) == 2
    assert capsys.readouterr().err == "nanscope doctor: error: --moe-aux-loss-coeff: 'x' is not a number\n"


def test_megatron_s_aux_and_z_losses_keep_a_finite_logit_s_gradient_finite():
    """The code behind the rule: through megatron-core's own functions, the aux and z losses' gradient is finite for
    finite logits, even where the z-loss value overflows; fp16 sigmoid scores divide 0 by 0."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core warns that TransformerEngine is not installed
        from megatron.core.transformer.moe import moe_utils

    def gradient(dtype, scale, score, offset=0.0):
        torch.manual_seed(0)
        logits = (torch.randn(64, 16) * scale + offset).to(dtype).requires_grad_()
        probs, _ = moe_utils.topk_routing_with_score_function(logits, 4, use_pre_softmax=False, score_function=score)
        z = moe_utils.z_loss_func(logits, 1e-3)
        with_z = moe_utils.MoEAuxLossAutoScaler.apply(logits, z)
        routing_map, scores = moe_utils.compute_routing_scores_for_aux_loss(with_z, 4, score)
        aux = moe_utils.switch_load_balancing_loss_func(scores, routing_map.sum(0), 64, 4, 16, 1e-2)
        moe_utils.MoEAuxLossAutoScaler.apply(probs, aux).float().sum().backward()
        return float(z), bool(torch.isfinite(logits.grad).all())

    for dtype in (torch.float32, torch.bfloat16):
        for score in ("softmax", "sigmoid"):
            assert gradient(dtype, 1.0, score)[1] is True
            assert gradient(dtype, 1e30, score) == (float("inf"), True)  # the z-loss value overflows, not its gradient
    assert gradient(torch.float16, 1e3, "softmax") == (float("inf"), True)
    assert gradient(torch.float16, 0.5, "sigmoid", offset=-30.0)[1] is False  # every sigmoid underflows: 0 / 0
