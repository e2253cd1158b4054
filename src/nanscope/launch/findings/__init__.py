"""The catalogue of rules from a slime configuration to NaN mechanisms, and what was checked and is fine.

Each rule reads the resolved configuration and returns a Finding (or nothing): the flags that are
the evidence, the mechanism in two sentences, and the fix (a flag change where one exists, else the
nanscope slime plugin). The semantics are the release's `policy_loss_function` / `compute_approx_kl` /
`compute_policy_loss` (`Config.release`; what differs between releases is data: `nanscope.facts.flags.FLAGS`
and `nanscope.facts.releases`) and megatron-core 0.15.0rc0's gradient check. A fix names only flags the
release defines (but for the two findings about the release itself, which name the script's flags the
release lacks, and nanscope's --slime-version). Each finding names its hazards by the records in
`nanscope.causes.catalogue`. The verdict prose that summarises the findings is rendered in
`nanscope.report.doctor`.

    finding.py   the Finding type, its severities, what the rules share
    release.py   flags and values the release's parser does not take
    loss.py      the loss's numerics: exp before clamp, temperature 0, clips not applied, the gradient check
    data.py      data at the loss's boundary: rollout log-probs, rewards, masked tool tokens
    layout.py    the batch and GPU layout: micro-batch budget, global-batch remainder, rollout GPUs
"""

from __future__ import annotations

from nanscope.facts.flags import SCRIPT
from nanscope.launch.config import Batches, Config
from nanscope.launch.findings import data, layout, loss, release
from nanscope.launch.findings.finding import SEVERITIES, Finding, release_of


def findings(cfg: Config, batches: Batches, world: int, cp: int) -> list[Finding]:
    """All rules that fire, most severe first (stable within a severity)."""
    rules = [
        release.undefined(cfg),
        release.rejected(cfg),
        loss.temperature(cfg),
        loss.kl(cfg),
        loss.unbiased_kl(cfg),
        data.tis(cfg),
        data.rollout_as_old(cfg),
        data.reward(cfg),
        data.masked(cfg),
        loss.ratio(cfg),
        loss.nan_check(cfg),
        loss.eps_clip_c(cfg),
        layout.budget(cfg, batches, cp),
        layout.remainder(cfg, batches),
        layout.colocate(cfg, world),
    ]
    out = [finding for finding in rules if finding is not None]
    return sorted(out, key=lambda finding: SEVERITIES.index(finding.severity))


def _uses_plugin(cfg: Config) -> bool:
    return cfg["loss_type"] == "custom_loss" and (cfg["custom_loss_function_path"] or "").startswith("nanscope.")


def fine(cfg: Config, batches: Batches, world: int, colocate_ok: bool) -> list[str]:
    """What was checked and is fine, one line each."""
    out = []
    if _uses_plugin(cfg):
        out.append(
            f"the loss is nanscope's plugin ({cfg['custom_loss_function_path']}): log-ratios clamped before "
            "exp, masks select, non-finite inputs dropped and counted"
        )
    if not cfg["use_kl_loss"]:
        out.append("no KL loss term (--use-kl-loss off): no exp of the reference log-ratio in the graph")
    elif cfg["kl_loss_type"] in ("kl", "k1", "k2"):
        default = cfg.origin("kl_loss_type") != SCRIPT
        out.append(
            f"--kl-loss-type {cfg['kl_loss_type']} has no exp: no KL overflow"
            + (
                f" (slime {cfg.release}'s default: the KL term's exp hazard needs --kl-loss-type low_var_kl or k3)"
                if default
                else ""
            )
        )
    if cfg["use_tis"]:
        out.append(
            f"TIS weight is clamped to [{cfg['tis_clip_low']:g}, {cfg['tis_clip']:g}]: an inf weight "
            "becomes the clip, only NaN passes"
        )
    if cfg["eps_clip_c"] is None:
        out.append("no --eps-clip-c: nothing silently ignored in the PPO clip")
    elif release_of(cfg).eps_clip_c_applied:
        out.append(
            f"--eps-clip-c {cfg['eps_clip_c']:g}: slime {cfg.release} applies dual-clip PPO "
            f"({release_of(cfg).eps_clip_c_at})"
        )
    if cfg["entropy_coef"] == 0:
        out.append(
            "--entropy-coef 0: the entropy is computed (max-subtracted softmax, stable) and reported but weighted 0"
        )
    if cfg["rollout_temperature"] > 0:
        out.append(f"--rollout-temperature {cfg['rollout_temperature']:g} > 0: logits / T stay finite")
    return out + _fine_layout(cfg, batches, world, colocate_ok)


def _fine_layout(cfg: Config, batches: Batches, world: int, colocate_ok: bool) -> list[str]:
    """The batch and GPU layout checks that passed."""
    out = []
    if batches.steps_per_rollout is not None and not batches.steps_remainder:
        out.append(
            f"{batches.samples_per_rollout} samples per rollout / global batch {batches.global_batch} = "
            f"{batches.steps_per_rollout} optimizer step(s) per rollout"
        )
    longest, budget = batches.longest_sample, batches.budget_tokens
    if budget is not None and longest is not None and longest <= budget:
        out.append(f"longest sample {longest} <= micro-batch budget {budget} tokens")
    if colocate_ok:
        rollout = cfg["rollout_num_gpus"]
        out.append(
            f"rollout GPUs ({rollout}) consistent with actor GPUs ({world})"
            if cfg["colocate"]
            else f"disaggregated: {rollout} rollout GPUs + {world} actor GPUs"
        )
    return out
