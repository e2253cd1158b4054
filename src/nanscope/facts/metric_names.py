"""What a logged metric's name says about when it was computed: an RL trainer computes some of its metrics from the
rollout before the update (the rewards, then the advantages and returns from them, the critic's values, the KL in
the reward), and the update's loss, gradient norm and ratio statistics after. A non-finite value that first shows in
one computed before the update points to that computation, not to the loss.

    verl v0.9.0 verl/trainer/ppo/metric_utils.py:429-566 (compute_data_metrics: critic/score, critic/rewards,
        critic/advantages, critic/returns, critic/values, logged from the batch the update then reads)
    verl v0.9.0 verl/trainer/ppo/core_algos.py:308-331 (GRPO's advantage: (score - group mean) / (group std +
        epsilon): a normaliser without its epsilon is 0/0 on a group of identical rewards)
    RLinf (issue RLinf#273): rollout/rewards, rollout/advantages_mean/max/min, then train/actor/* in one postfix

    BEFORE_UPDATE: name part (lowered) -> what it is
"""

from __future__ import annotations

import re

BEFORE_UPDATE = (
    ("advantage", "the advantages"),
    ("returns", "the returns"),
    ("values", "the critic's value estimates"),
    ("critic/kl", "the KL penalty in the reward"),
)
# name parts of the reward a trainer scores the rollout with (finite: the advantage computation is what went wrong)
REWARDS = ("reward", "score", "return")

# the keys that name a step (exact, or a key's last `/` or ` ` part: `train/global_step`, `Learning iteration`); fairseq's
# update count (progress_bar.py:392), a loop's counter
STEP_KEYS = ("step", "global_step", "iteration", "iter", "steps", "updates", "global_step/max_steps", "it",
             "num_updates", "local_step", "_step")  # fmt: skip  # `_step`: W&B's own step in a run's summary
# a key that holds a step's word but measures a time (`time/time/step`, `train_step_timing in s`, `step_time`)
_TIMES = frozenset(("time", "times", "timing", "timer", "timers", "duration", "elapsed", "sec", "secs", "seconds",
                    "ms", "s", "per", "speed", "throughput"))  # fmt: skip
# a key that ends in a step's word but names a setting (Unsloth's banner: `Gradient accumulation steps = 4`,
# `Total steps = 200`; a Trainer's `Num warmup steps`)
STEP_SETTINGS = frozenset(("accumulation", "accum", "warmup", "total", "max", "num", "eval", "save", "logging",
                           "checkpoint", "decay"))  # fmt: skip
# words that name a metric in a table's header or its caption (`| step | loss |`, `grad_norm per step:`)
METRIC_WORDS = re.compile(r"(?<![a-z])(?:loss|grad[ _]?norm|gradient[ _]norm|kl|rewards?|score|entropy|perplexity|"
                          r"ppl|acc(?:uracy)?|lr|learning[ _]rate|returns?|advantages?)(?![a-z])", re.IGNORECASE)  # fmt: skip


# what a Trainer-logged loss of 0.0 can be: transformers' Trainer leaves a step's NaN or Inf loss out of its logging
# window's sum (logging_nan_inf_filter, on by default: 4.48.1 trainer.py:2533-2539) and logs sum / steps (:3053-3058)
TRAINER_ZERO = ("transformers' Trainer logs 0.0 for a logging window whose every step's loss was NaN or Inf (its "
                "logging_nan_inf_filter, on by default, leaves them out)")  # fmt: skip


def is_step_key(key: str) -> bool:
    """`key` names a training step (not a time per step)."""
    low = key.lower()
    if low in STEP_KEYS:
        return True
    named = low.rsplit("/", 1)[-1] in STEP_KEYS or low.rsplit(" ", 1)[-1] in STEP_KEYS
    words = re.split(r"[/_ .()-]+", low)
    return named and not _TIMES.intersection(words) and not STEP_SETTINGS.intersection(words)


# a name's first word (a GAN's spelled-out `Discriminator Loss`, a TensorFlow scope's `actor_network`) -> its model
NAME_MODELS = {"d": "discriminator", "disc": "discriminator", "discriminator": "discriminator", "g": "generator",
               "gen": "generator", "generator": "generator", "policy": "policy", "pi": "policy", "actor": "actor",
               "actornetwork": "actor", "critic": "critic", "criticnetwork": "critic", "vf": "critic",
               "value": "critic", "value_function": "critic"}  # fmt: skip
# a statistic's word before a name, no model's (`Mean value_function loss`, `Average Episodic Return`)
STATISTIC_WORDS = ("mean", "average", "avg")
# rsl-rl from v2.3.0 prints its loss dict's keys as `Mean {key} loss:` (v2.3.0 algorithms/ppo.py:418
# `"value_function"`, runners/on_policy_runner.py:363): `Mean value_function loss: inf` (holdout19 18) is the critic's

# a key's prefix (or its start) -> the model it names (None: the rollout's data, no model's failure)
# verl logs its data metrics under `critic/` too (compute_data_metrics): the scores and rewards are the reward's,
# the advantages and returns computed from them; `critic/kl` is the KL in the reward.
# a GAN's losses spelled out (zhysora/PSGan-Family#10: pix2pix-style `discrim_loss`, `gen_loss_GAN`, `gen_loss_L1`);
# a bare `D_loss`/`G_loss` is left to a line that writes it spaced (launch.loop_counters.rename)
# rsl-rl's PPO (rsl_rl/runners/on_policy_runner.py:185-186 at ff9e971): the value function loss is the critic's
KEY_MODELS = (("critic/score", "reward"), ("critic/rewards", "reward"), ("critic/advantages", None),
              ("critic/returns", None), ("critic/kl", None), ("actor/", "actor"), ("critic/", "critic"), ("ref/", "reference"),
              ("reference/", "reference"), ("reward_model/", "reward model"), ("act_", "actor"), ("cri_", "critic"), ("vf_", "critic"),
              ("policy_loss", "policy"), ("actor_loss", "actor"), ("critic_loss", "critic"), ("value_loss", "critic"),
              ("ref_", "reference"), ("value function loss", "critic"), ("mean value loss", "critic"),
              ("surrogate loss", "actor"), ("mean surrogate loss", "actor"), ("discrim", "discriminator"),
              ("gen_loss", "generator"), ("generator", "generator"))  # fmt: skip

# OpenRLHF's progress-bar postfix up to v0.6 (openrlhf/trainer/ppo_trainer.py:300-311 at v0.6.0, :286-297 at v0.5.0):
# short keys for the actor's and critic's status, exact key -> model; `glen` and `tlen` (lengths) mark the postfix
OPENRLHF_SHORT = {"pg": "actor", "cri": "critic", "vals": "critic", "rm": "reward"}
OPENRLHF_MARKS = frozenset({"glen", "tlen"})
