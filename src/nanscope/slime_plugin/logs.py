"""What the plugin logs and warns about, on the rank slime logs from, through the running release's own path.

    metrics   nanscope/* at slime's train/step: wandb.log in v0.1.0 (model.py:468), slime/utils/logging_utils.log
              (wandb and TensorBoard) in v0.2.4 and v0.3.1, slime/observability/logging_utils.log on main
              (`facts.releases.LossApi.metrics_logger`); nanscope's model of v0.1.0 takes v0.1.0's path
    warnings  one line, `nanscope: warning: ...`, when the step's headroom crosses a threshold (a log-ratio above
              20, where the plugin's loss would clamp it; above 60, within 30 of fp32's exp overflow at 88.72; a train-rollout
              gap above NANSCOPE_WARN_GAP; any non-finite loss input), and a rate-limited wandb.alert with wandb on

A failure to log (wandb down, a misconfigured TensorBoard) is one warning line: never the end of the run.
"""

from __future__ import annotations

import collections
import datetime
import importlib
import math

from nanscope.facts.numerics import FP32_EXP_MAX, LOG_RATIO_BOUND
from nanscope.slime_plugin.outputs import warn
from nanscope.slime_plugin.settings import Settings

# Log-ratio metrics the thresholds watch, and how the warning names each.
LOG_RATIOS = {
    "nanscope/max_kl_log_ratio": "KL log-ratio ref - logp",
    "nanscope/max_ppo_log_ratio": "PPO log-ratio logp - old",
    "nanscope/max_tis_log_ratio": "TIS log-ratio old - rollout",
}
ALERT_EVERY = datetime.timedelta(minutes=10)  # wandb.alert's wait between alerts of the same title
KEPT = 1000  # steps whose metrics `nanscope.slime_plugin.logged()` returns: a run of any length holds no more


def train_step(args, rollout_id: int, step_id: int) -> int:
    """slime's `train/step`: rollout_id x optimizer steps per rollout + step_id."""
    steps = args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    return rollout_id * steps + step_id


def warnings_for(metrics: dict, where: dict, settings: Settings) -> list[tuple[str, str]]:
    """The threshold crossings of one step's metrics, as (title, text): the most severe threshold only per metric;
    the title names the metric and the threshold (wandb.alert rate-limits alerts of the same title)."""
    out = []
    low, high = settings.warn_log_ratio
    for name, what in LOG_RATIOS.items():
        value = metrics.get(name)
        if value is None:
            continue
        at = _at(where.get(name))
        if math.isnan(value):
            out.append((f"{name} is NaN", f"{name} is NaN ({what}){at}"))
        elif value > high:
            if value < FP32_EXP_MAX:
                how = f"within {FP32_EXP_MAX - value:.3g} of fp32's exp overflow at {FP32_EXP_MAX:.2f}"
            else:  # the loss's exp is inf here, unless the plugin's loss clamps it
                how = f"past fp32's exp overflow at {FP32_EXP_MAX:.2f} by {value - FP32_EXP_MAX:.3g}"
            out.append((f"{name} > {high:g}", f"{name} = {value:.4g} > {high:g}: {how} ({what}){at}"))
        elif value > low:
            text = f"{name} = {value:.4g} > {low:g} (the plugin's loss clamps log-ratios at ±{LOG_RATIO_BOUND:g}) ({what}){at}"
            out.append((f"{name} > {low:g}", text))
    gap = metrics.get("nanscope/train_rollout_gap_max")
    if gap is not None and (math.isnan(gap) or gap > settings.warn_gap):
        shown = "NaN" if math.isnan(gap) else f"{gap:.4g}"
        text = (
            f"nanscope/train_rollout_gap_max = {shown} > NANSCOPE_WARN_GAP={settings.warn_gap:g}"
            f"{_at(where.get('nanscope/train_rollout_gap_max'))}"
        )
        out.append(("nanscope/train_rollout_gap_max > NANSCOPE_WARN_GAP", text))
    bad = metrics.get("nanscope/nonfinite_inputs")
    if bad:
        out.append(("nanscope/nonfinite_inputs", f"{int(bad)} non-finite loss input entries (log-probs or advantages)"))
    return out


def _at(place: dict | None) -> str:
    if not place:
        return ""
    return f", at rank {place['rank']}, micro-batch {place['microbatch']}, sample {place['sample']}"


class Logger:
    """Logs one step's metrics on the rank slime logs from, and prints the warnings they call for."""

    def __init__(self, settings: Settings, metrics_logger: str | None, logs: bool):
        self.settings, self.metrics_logger, self.logs = settings, metrics_logger, logs
        self.logged: collections.deque[dict] = collections.deque(maxlen=KEPT)  # the last steps, for `logged()`
        self._defined = False  # wandb.define_metric("nanscope/*") has been called

    def step(self, args, where: dict, metrics: dict, places: dict) -> None:
        if not self.logs:
            return
        crossed = warnings_for(metrics, places, self.settings)
        texts = [f"rollout {where['rollout_id']} step {where['step_id']}: {text}" for _, text in crossed]
        self.logged.append({**where, **metrics, "warnings": texts})  # the lines printed, for `logged()`
        for (title, text), line in zip(crossed, texts):
            warn(line)
            self._alert(args, title, text)
        shown = {k: v for k, v in metrics.items() if v is not None}
        try:
            self._log(args, where, shown)
        except Exception as e:  # wandb down, TensorBoard misconfigured: never the end of the run
            warn(f"could not log {sorted(shown)}: {type(e).__name__}: {e}")

    def _log(self, args, where: dict, metrics: dict) -> None:
        if self.metrics_logger is None and not getattr(args, "use_wandb", False):
            return
        metrics = {**metrics, "train/step": train_step(args, where["rollout_id"], where["step_id"])}
        if self.metrics_logger is not None:  # v0.2.4 on: the release's own logger (wandb and TensorBoard)
            module, _, name = self.metrics_logger.rpartition(".")
            getattr(importlib.import_module(module), name)(args, metrics, step_key="train/step")
        elif getattr(args, "use_wandb", False):
            import wandb  # optional: slime v0.1.0's own logger

            if not self._defined:
                wandb.define_metric("nanscope/*", step_metric="train/step")
                self._defined = True
            wandb.log(metrics)

    def _alert(self, args, title: str, text: str) -> None:
        if not getattr(args, "use_wandb", False):
            return
        try:
            import wandb  # optional: slime's own logger

            wandb.alert(title=f"nanscope: {title}", text=text, wait_duration=ALERT_EVERY)
        except Exception as e:
            warn(f"could not send a wandb alert: {type(e).__name__}: {e}")
