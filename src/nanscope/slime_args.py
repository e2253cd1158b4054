"""slime v0.1.0's argument defaults for the fields its loss path reads, and the case's values.

slime parses one argparse namespace (its own flags plus Megatron's). nanscope only ever needs the
fields below; `loss_args()` builds a namespace with slime's field names so the loss can be called
exactly as slime calls it. Defaults are read from slime v0.1.0 `slime/utils/arguments.py` and
Megatron's `--calculate-per-token-loss` / `--check-for-nan-in-loss-and-grad`.
"""

from __future__ import annotations

from types import SimpleNamespace

# slime v0.1.0 defaults (field name -> default). eps_clip_high=None means "same as eps_clip".
LOSS_DEFAULTS: dict[str, object] = {
    "loss_type": "policy_loss",
    "advantage_estimator": "grpo",
    "rollout_temperature": 1.0,
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,  # accepted by v0.1.0's parser, never passed to compute_policy_loss
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "kl",
    "kl_coef": 0.0,
    "entropy_coef": 0.0,
    "use_tis": False,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "n_samples_per_prompt": 1,
    "rewards_normalization": True,
    "grpo_std_normalization": True,
    "calculate_per_token_loss": False,  # Megatron flag
    "check_for_nan_in_loss_and_grad": True,  # Megatron flag; --no-check-for-nan-in-loss-and-grad
    "global_batch_size": 1,
    "custom_loss_function_path": None,
}

# The GRPO flags of ../shared/cases/slime-795/launch.sh (what differs from the defaults).
CASE_LOSS_FLAGS: dict[str, object] = {
    "advantage_estimator": "grpo",
    "rollout_temperature": 0.8,
    "n_samples_per_prompt": 8,
    "use_kl_loss": True,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "low_var_kl",
    "entropy_coef": 0.0,
    "eps_clip": 0.2,
    "eps_clip_high": 0.28,
    "use_tis": True,
}


def loss_args(**overrides) -> SimpleNamespace:
    """A namespace with slime v0.1.0's field names and defaults, `overrides` applied.

    Resolves eps_clip_high=None to eps_clip, as slime's argument validation does.
    """
    unknown = set(overrides) - set(LOSS_DEFAULTS)
    assert not unknown, f"not a slime loss field: {sorted(unknown)}"
    ns = SimpleNamespace(**{**LOSS_DEFAULTS, **overrides})
    if ns.eps_clip_high is None:
        ns.eps_clip_high = ns.eps_clip
    return ns


def case_args(**overrides) -> SimpleNamespace:
    """`loss_args` with the case's GRPO flags (kl-loss-coef 0 with low_var_kl, TIS, T=0.8)."""
    return loss_args(**{**CASE_LOSS_FLAGS, **overrides})
