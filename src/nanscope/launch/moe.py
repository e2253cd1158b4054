"""doctor's rules for the MoE causes: the router's auxiliary losses, zero-token experts, the router's logits.

Each rule reads the MoE flags (`facts.flags`: Megatron's, with megatron core_v0.15.0rc0's defaults) and cites
megatron-core 0.15.0rc0 at file:line (`megatron/core/...`; TransformerEngine at v2.6 where the grouped GEMM is its).
The flags usually live in the model-args file a launch script sources. When the script sources a file nanscope
did not read (`Config.unread`), a cause whose deciding flags the script itself does not give stays undecidable:
the evidence names those flags and gives the rule's result for slime's own model-args file of that model
(`facts.slime_models`), marked as assumed.

    status, evidence = aux_loss(cfg)    # (launch.status.*, [lines])
"""

from __future__ import annotations

from nanscope.causes import catalogue
from nanscope.facts import releases
from nanscope.facts.flags import BY_NAME, SCRIPT
from nanscope.facts.megatron import MCORE
from nanscope.facts.slime_models import ModelArgs, matching
from nanscope.launch.config import Config, resolve
from nanscope.launch.status import ENABLED, RULED_OUT, UNDECIDABLE

# The flags that decide each cause (beyond --num-experts): the script must give them when a source is unread.
DECIDING = {
    catalogue.MOE_AUX_LOSS.name: ("moe_aux_loss_coeff", "moe_router_load_balancing_type", "moe_z_loss_coeff"),
    catalogue.MOE_ZERO_TOKEN_EXPERT.name: ("moe_grouped_gemm", "moe_use_legacy_grouped_gemm", "transformer_impl"),
    catalogue.MOE_ROUTER_LOGITS.name: ("moe_router_dtype", "moe_router_load_balancing_type", "fp16"),
}
NONE_CHANGES_NOTHING = (
    f"--moe-router-load-balancing-type none changes nothing in {MCORE}: it only makes get_aux_loss_coeff return 0 "
    "(router.py:203-216), and at coefficient 0 _apply_aux_loss and _apply_seq_aux_loss already return before "
    "computing anything (router.py:229-231, :268-270); it leaves the z-loss as it is (router.py:343)"
)
_FINITE_GRADIENT = (
    "from the code its gradient is finite wherever the router's logits are: MoEAuxLossAutoScaler.backward sends "
    "ones x the loss scale whatever the loss's value (moe_utils.py:201), d aux / d scores is tokens_per_expert x a "
    "constant (moe_utils.py:107-110), d z-loss / d logits is 2 logsumexp x softmax x coeff / tokens "
    "(moe_utils.py:125): a non-finite logit there is moe-router-logits (or an activation upstream)"
)


def aux_loss(cfg: Config) -> tuple[str, list[str]]:
    return _open(cfg, catalogue.MOE_AUX_LOSS.name, _aux_loss)


def zero_token_expert(cfg: Config) -> tuple[str, list[str]]:
    return _open(cfg, catalogue.MOE_ZERO_TOKEN_EXPERT.name, _zero_token_expert)


def router_logits(cfg: Config) -> tuple[str, list[str]]:
    return _open(cfg, catalogue.MOE_ROUTER_LOGITS.name, _router_logits)


def _open(cfg: Config, name: str, rule) -> tuple[str, list[str]]:
    """The rule on `cfg`, unless the flags deciding it may sit in a sourced file that was not read: then undecidable,
    naming those flags, with the rule's result for slime's own model-args file of that model, marked as assumed."""
    names = ("num_experts", *DECIDING[name])
    unknown = [flag for flag in names if cfg.origin(flag) != SCRIPT and not _architecture(cfg, flag)]
    if not cfg.unread or not unknown:
        return rule(cfg)
    path, line = cfg.unread[0]
    evidence = [
        f"decided by {', '.join(BY_NAME[flag].spelling for flag in unknown)}: not in the launch script; line {line} "
        f"sources {path}, which was not read (pass --model-args FILE)"
    ]
    model = next((found for found in (matching(p) for p, _ in cfg.unread) if found is not None), None)
    if model is None:
        return UNDECIDABLE, evidence + ["nanscope has no slime model-args file of this model to assume"]
    status, assumed = rule(_with_model_args(cfg, model))
    head = f"assumed, with slime {model.release}'s own {model.path} for this model (bundled values): {status}"
    return UNDECIDABLE, evidence + [head] + [f"assumed: {text}" for text in assumed]


def _architecture(cfg: Config, flag: str) -> bool:
    """--num-experts from an architecture JSON standing in for the model-args file: known (the others are not)."""
    return flag == "num_experts" and cfg.origin(flag) not in (SCRIPT, BY_NAME[flag].owner)


def _with_model_args(cfg: Config, model: ModelArgs) -> Config:
    """`cfg`'s launch with `model`'s flags first (the script's own flags win), each value citing its file line."""
    argv = [word for flag, words in cfg.given.items() for word in (flag, *words)]
    assumed = resolve(model.argv() + argv, release=cfg.release)
    for spec in map(BY_NAME.get, (flag.removeprefix("--").replace("-", "_") for flag, _, _ in model.flags)):
        if spec is not None and spec.spelling not in cfg.given:
            assumed.values[spec.name].origin = f"{model.path}:{model.line(spec.spelling)}"
    return assumed


def _flag(cfg: Config, name: str) -> str:
    """`--flag value` as written, and where the value came from unless the launch script gave it."""
    origin, spec = cfg.origin(name), BY_NAME[name]
    text = f"(no {spec.spelling})" if cfg[name] is None and spec.kind not in ("true", "false") else cfg.flag_text(name)
    return text + ("" if origin == SCRIPT else f" [{origin}]")


def _dense(cfg: Config) -> tuple[str, list[str]] | None:
    if cfg["num_experts"]:
        return None
    return RULED_OUT, [f"{_flag(cfg, 'num_experts')}: a dense model, no router and no experts"]


def _types(cfg: Config) -> list[str]:
    return list(cfg["moe_router_load_balancing_type"])


def _coefficient(cfg: Config, kind: str) -> float:
    """router.get_aux_loss_coeff (router.py:203-216): the coefficient of `kind` under the load-balancing type(s)."""
    types, coeffs = _types(cfg), list(cfg["moe_aux_loss_coeff"])
    if kind not in types:
        return 0.0
    index = types.index(kind) if len(types) > 1 else 0
    return coeffs[index] if index < len(coeffs) else 0.0


def _aux_loss(cfg: Config) -> tuple[str, list[str]]:
    dense = _dense(cfg)
    if dense is not None:
        return dense
    on = [kind for kind in ("aux_loss", "seq_aux_loss") if _coefficient(cfg, kind) > 0]
    flags = f"{_flag(cfg, 'moe_router_load_balancing_type')}, {_flag(cfg, 'moe_aux_loss_coeff')}"
    zero = all(coeff == 0 for coeff in cfg["moe_aux_loss_coeff"])
    evidence = [f"{flags}: " + (f"the {' and '.join(on)} loss is computed" if on else _no_aux(cfg, zero))]
    if zero:
        evidence.append(NONE_CHANGES_NOTHING)
    z = cfg["moe_z_loss_coeff"]
    if z is None:
        evidence.append(f"{_flag(cfg, 'moe_z_loss_coeff')}: router.py:343 computes the z-loss only when it is set")
    else:
        evidence.append(f"{_flag(cfg, 'moe_z_loss_coeff')}: the z-loss is computed (router.py:343), at 0 too")
    if cfg["moe_router_enable_expert_bias"]:
        evidence.append("--moe-router-enable-expert-bias: a sign update of the bias (moe_utils.py:829-847), finite")
    if not on and z is None:
        return RULED_OUT, evidence
    dtype, why = _dtype(cfg)
    if on and cfg["moe_router_score_function"] == "sigmoid" and dtype == "fp16" and not cfg["moe_router_dtype"]:
        return ENABLED, evidence + [
            f"{why}; {_flag(cfg, 'moe_router_score_function')}, {_flag(cfg, 'moe_router_dtype')}: the aux scores "
            "divide fp16 sigmoids by their sum + 1e-20 (moe_utils.py:621-622), and 1e-20 is 0 in fp16: 0 / 0 = NaN "
            "for a token whose every sigmoid underflows"
        ]
    if cfg["moe_router_fusion"]:
        return UNDECIDABLE, evidence + [
            "--moe-router-fusion: TransformerEngine's fused aux loss and scores (moe_utils.py:95-105), not read here"
        ]
    return RULED_OUT, evidence + [_FINITE_GRADIENT]


def _no_aux(cfg: Config, zero: bool) -> str:
    if zero:
        return (
            "coefficient 0: router.py:229-231 and :268-270 return before computing either load-balancing loss, "
            "and :434 computes no aux scores"
        )
    if "sinkhorn" in _types(cfg):
        return "sinkhorn computes no aux loss and asserts a coefficient 0 (router.py:188)"
    return "get_aux_loss_coeff returns 0 for aux_loss and seq_aux_loss (router.py:203-216): no load-balancing loss"


def _dtype(cfg: Config) -> tuple[str, str]:
    """(the model's compute dtype under slime, why): bf16 unless fp16 is possible and asked for."""
    if not cfg["fp16"]:
        return "bf16", f"slime {cfg.release} trains in bf16"
    if cfg.release == releases.V0_1_0:
        return "bf16", (
            "--fp16: slime v0.1.0 sets args.bf16 = True (slime/backends/megatron_utils/arguments.py:11) and "
            "megatron refuses both (arguments.py:643-644): bf16 or no run"
        )
    if cfg["expert_model_parallel_size"] > 1:
        return "bf16", "--fp16 with expert parallelism: megatron refuses it (arguments.py:954-956)"
    return "fp16", f"--fp16 (slime {cfg.release}: args.bf16 = not args.fp16)"


def _router_logits(cfg: Config) -> tuple[str, list[str]]:
    dense = _dense(cfg)
    if dense is not None:
        return dense
    if "sinkhorn" in _types(cfg):
        return ENABLED, [
            f"{_flag(cfg, 'moe_router_load_balancing_type')}: exp of the fp32 logits with no max subtracted "
            "(moe_utils.py:131, router.py:191-193): a logit past 88.72 is inf, and inf / inf is NaN"
        ]
    router, (dtype, why) = cfg["moe_router_dtype"], _dtype(cfg)
    where = _flag(cfg, "moe_router_dtype")
    if router in ("fp32", "fp64"):
        return RULED_OUT, [
            f"{where}: the router's GEMM writes {router} logits (router.py:79-82, moe_utils.py:931-935) and top-k's "
            "softmax runs in fp32 (moe_utils.py:571, 575): a non-finite logit needs a non-finite hidden state "
            "(activation-overflow)"
        ]
    if dtype == "fp16":
        return ENABLED, [
            f"{where}: the logits are the input's dtype (router.py:78-83)",
            f"{why}: a logit past 65504 is inf, and the softmax's inf - inf is NaN",
            "sigmoid scores are normalised by their sum + 1e-20 (moe_utils.py:584), and 1e-20 is 0 in fp16: 0 / 0 "
            "once every expert's sigmoid underflows",
        ]
    evidence = [
        f"{where}: the logits are bf16 ({why}; router.py:78-83)",
        "bf16 has fp32's exponent range: a logit overflows only where an fp32 one would (past 3.4e38, from a "
        "non-finite hidden state: activation-overflow); top-k's softmax runs in fp32 (moe_utils.py:571, 575)",
    ]
    if cfg["num_experts"] >= 32:
        evidence.append(
            "megatron warns for >= 32 experts without fp32 routing (transformer_config.py:1379-1387): routing "
            "precision, not NaN"
        )
    return RULED_OUT, evidence


def _zero_token_expert(cfg: Config) -> tuple[str, list[str]]:
    dense = _dense(cfg)
    if dense is not None:
        return dense
    grouped = _flag(cfg, "moe_grouped_gemm")
    if not cfg["moe_grouped_gemm"]:
        return RULED_OUT, [
            f"{grouped}: SequentialMLP runs each expert on its own rows, and one with 0 tokens multiplies 0 rows: "
            "exact zero gradients (experts.py:1076-1089)"
        ]
    experts, topk = cfg["num_experts"], cfg["moe_router_topk"]
    ordinary = (
        f"{_flag(cfg, 'num_experts')}, {_flag(cfg, 'moe_router_topk')}: an expert gets 0 tokens whenever none of a "
        f"micro-batch's tokens picks it among its top {topk} of {experts} ({_flag(cfg, 'moe_token_dispatcher_type')})"
    )
    legacy = cfg["moe_use_legacy_grouped_gemm"] or cfg["transformer_impl"] == "local"
    if legacy:
        which = (
            "--moe-use-legacy-grouped-gemm" if cfg["moe_use_legacy_grouped_gemm"] else _flag(cfg, "transformer_impl")
        )
        return ENABLED, [
            grouped,
            f"{which}: the legacy GroupedMLP (transformer_engine_spec_provider.py:61-78, backends.py:104-117) calls "
            "grouped_gemm's gmm (experts.py:268-286), whose weight gradient is torch.empty (grouped_gemm v1.1.4 "
            "backend.py:22, ops.py:35-36), one cuBLAS GEMM per expert with k = its tokens (grouped_gemm.cu:303-306); "
            "tgale96/grouped_gemm#36: a zero-size group's region is never written",
            ordinary,
        ]
    return UNDECIDABLE, [
        grouped,
        f"{_flag(cfg, 'transformer_impl')}: TEGroupedMLP on TransformerEngine's GroupedLinear "
        "(transformer_engine_spec_provider.py:61-78)",
        f"TransformerEngine 2.6, the release {MCORE} pairs with (Megatron-LM pyproject.toml:80), zeroes an empty "
        "group's weight gradient unless it accumulates (transformer_engine/pytorch/csrc/extensions/gemm.cpp:390-391) "
        "and then leaves Megatron's main_grad, zeroed every step (param_and_grad_buffer.py:849-853), as it is "
        f"(module/grouped_linear.py:319-324, 367-373; {_flag(cfg, 'gradient_accumulation_fusion')}): not this cause "
        "on TE 2.6",
        "which grouped GEMM the image runs is not in the flags: slime v0.1.0's image installs TransformerEngine@stable "
        "(docker/Dockerfile:28) next to grouped_gemm v1.1.4 (:20)",
        ordinary,
    ]
