"""A namespace with slime's field names for the fields its loss path reads, as slime's parser fills it.

slime parses one argparse namespace (its own flags plus Megatron's). nanscope's loss only ever needs
the fields in `LOSS_FIELDS`; `loss_args()` builds a namespace with those names, so the loss can be
called exactly as slime calls it. Their defaults live in one table, `nanscope.facts.flags.FLAGS`;
the case's values come from the bundled launch script (`nanscope.case`), which passes them in.
"""

from __future__ import annotations

from types import SimpleNamespace

from nanscope.facts.flags import BY_NAME, eps_clip_high

# The namespace fields slime v0.1.0's loss path reads (loss_function, policy_loss, the reducer).
LOSS_FIELDS = (
    "loss_type", "advantage_estimator", "rollout_temperature", "eps_clip", "eps_clip_high",
    "eps_clip_c",  # accepted by v0.1.0's parser, never passed to compute_policy_loss
    "use_kl_loss", "kl_loss_coef", "kl_loss_type", "kl_coef", "entropy_coef", "use_tis", "tis_clip",
    "tis_clip_low", "n_samples_per_prompt", "rewards_normalization", "grpo_std_normalization",
    "calculate_per_token_loss", "check_for_nan_in_loss_and_grad", "global_batch_size",
    "custom_loss_function_path",
)  # fmt: skip

# Field -> slime's (or Megatron's) default; global_batch_size 1 so a namespace is usable as built.
LOSS_DEFAULTS: dict[str, object] = {k: BY_NAME[k].default for k in LOSS_FIELDS} | {"global_batch_size": 1}


def loss_args(**overrides) -> SimpleNamespace:
    """A namespace with slime's field names and defaults, `overrides` applied.

    Resolves eps_clip_high=None as slime's argument validation does (facts.flags.eps_clip_high).
    """
    unknown = set(overrides) - set(LOSS_DEFAULTS)
    assert not unknown, f"not a slime loss field: {sorted(unknown)}"
    ns = SimpleNamespace(**{**LOSS_DEFAULTS, **overrides})
    ns.eps_clip_high = eps_clip_high(ns.eps_clip, ns.eps_clip_high)
    return ns
