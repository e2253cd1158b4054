"""nanscope inside a real verl run (v0.9.0): the NaN-safe loss mode, the sentinel, the report, the skip.

Install with one config line (verl imports it in every worker during init_model, before it builds the engine):

    actor_rollout_ref.model.external_lib=nanscope.verl_plugin

(fallback: VERL_USE_EXTERNAL_MODULES=nanscope.verl_plugin in the workers' environment). Optionally the NaN-safe
loss: actor_rollout_ref.actor.policy_loss.loss_mode=nanscope (it wraps NANSCOPE_INNER_LOSS_MODE, default
vanilla). The settings are the slime plugin's NANSCOPE_* variables (`slime_plugin.settings`), read once at import:
a bad value ends init_model with one line, as does a verl the plugin does not know (`signatures`).

    install.py     what importing this module does: settings, signatures, the loss mode, the engines
    loss.py        the `nanscope` policy loss mode (nanscope.loss.padded's guard around the inner mode)
    engine.py      the engine subclasses (FSDP, FSDP2, Megatron; language_model and value_model)
    watch.py       one engine's step: the slime plugin's state machine (vote, report, rerun, verdict, raise or skip)
    inputs.py      a mini-batch's non-finite inputs cleaned before verl counts its tokens
    headroom.py, record.py, report.py, skips.py, signatures.py

docs/verl.md has the install line, the settings and what each mode does and costs.
"""

from __future__ import annotations

from nanscope.verl_plugin.install import install

INSTALLED = install()
