"""The CPU run's layer spec, through slime's own `--spec` hook: `--custom-megatron-init-path nanscope.slime_train.spec.use_spec`.

slime's model provider imports `args.spec` (module, name) and, when it is callable, calls it with the run's args
(backends/megatron_utils/model_provider.py:59-63 at v0.1.0). `layer_spec` returns the tiny model's block spec for
this pipeline stage: megatron-core's local layers (`--transformer-impl local`) with sequence-parallel RMSNorms and
the variable-length attention slime's THD micro-batches need on CPU (`nanscope.megatron.varlen`).

The spec cannot be given as `--spec` on the command line: Megatron-LM's validate_args, which slime's parser calls
(utils/arguments.py:1023), refuses a spec for a MoE model at core_v0.15.0rc0 (training/arguments.py:941, "Model
Spec must be None when using MoEs"; slime's own later Megatron patches delete that line, v0.3.1
docker/patch/v0.5.6/megatron.patch:829). slime's `--custom-megatron-init-path` hook runs in every actor after
that validation and before the model is built (backends/megatron_utils/initialize.py:100-104, called from
actor.py:43); `use_spec` sets `args.spec` there. No slime or Megatron-LM function is replaced: the spec is an
input slime's own provider reads.
"""

from __future__ import annotations

SPEC = ("nanscope.slime_train.spec", "layer_spec")  # args.spec: module, then the function's name


def use_spec(args) -> None:
    """slime's custom Megatron init hook: the run's layer spec is `layer_spec` (what `--spec` would have set)."""
    args.spec = list(SPEC)


def layer_spec(args, config=None, vp_stage=None):
    """The block spec for `args` (Megatron-LM's parsed arguments, as slime hands them to its --spec).

    v0.1.0 calls it with the args alone (model_provider.py:63); v0.3.1 and main add the TransformerConfig it built
    and the virtual pipeline stage (v0.3.1 model_provider.py:108), which the run never uses (no virtual stages).
    """
    from megatron.training.arguments import core_transformer_config_from_args  # heavy: Megatron-LM, in the run

    from nanscope.megatron import varlen  # heavy: megatron-core

    assert vp_stage is None, "the CPU run has no virtual pipeline stages"
    return varlen.layer_spec(config if config is not None else core_transformer_config_from_args(args))
