"""The NaN without a planted value: a GRPO loop in the harness whose own training drives the KL's exp past fp32.

    check = run_natural(seed=0, steps=40, lr=1e-3)
    check.died_at, check.crossing, check.warned, check.ok

One launch of the 4-rank harness (TP2 x PP2), two runs of the same seed: the same initial model, prompts and
sampler draws, each step's batch sampled from that run's current policy (`megatron/natural.py`):

- as-is: slime v0.1.0's loss with the case's flags (--use-kl-loss --kl-loss-coef 0 --kl-loss-type low_var_kl,
  --use-tis). It dies with the case's message through megatron-core's DDP bucket check at the step whose batch
  takes an exp past fp32's 88.72.
- plugin: slime with nanscope's plugin as its README installs it (the hook, raise mode; the NaN-safe loss as
  slime's custom loss). It trains through every step, finite, counting nan_guard/exp_overflow, and its hook warns
  at its default thresholds (log-ratio 20 and 60) on the way there.

Up to the as-is death the two runs are the same training, step for step: the guard changes nothing while every
exp is finite (kl-loss-coef 0 gives the KL term a zero gradient either way), which `same_until_death` checks on
the recorded series. Rendering lives in nanscope.report.natural.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from nanscope import case
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.megatron import launcher, scratch
from nanscope.megatron.spec import Launcher, Layout, RunSpec
from nanscope.repro import WARN_LEAD, Repro, from_run, harness_notes

DEFAULT_LR = 1e-3  # 1000x the case's 1e-6: its thousands of rollouts in tens of steps
DEFAULT_STEPS = 40  # every one of 10 seeds died by step 30 at DEFAULT_LR (benchmarks/README.md, natural)
TIMEOUT_S = 1800.0  # `repro --natural`'s default bound on its launch: two runs of up to 40 steps on 2 loaded cores
# The exps of slime v0.1.0's loss in the order it computes them (compute_policy_loss, TIS, compute_approx_kl): at one
# step the first of them to overflow is the one that crossed first.
EXPS = {"max_ppo_log_ratio": "PPO ratio", "max_tis_log_ratio": "TIS", "max_kl_log_ratio": "KL"}


@dataclass
class NaturalCheck:
    """The natural loop's two runs of one seed."""

    seed: int
    steps: int
    lr: float
    as_is: Repro  # expected: dies at some step with megatron's NaN check
    plugin: Repro  # expected: completes every step, finite
    wall_s: float
    notes: list[str]

    @property
    def died_at(self) -> int | None:
        steps = [record.error_step for record in self.as_is.ranks if not record.ok]
        return min(steps) if steps else None

    @property
    def message(self) -> str | None:
        """The as-is run's error, as its first failing rank raised it."""
        first = next((r for r in self.as_is.ranks if r.rank == self.as_is.first_failure), None)
        return first.error if first else None

    @property
    def series(self) -> list[dict]:
        """The plugin run's headroom per step (it trains through every step), from the last stage's TP rank 0."""
        return series_of(self.plugin)

    @property
    def as_is_series(self) -> list[dict]:
        return series_of(self.as_is)

    @property
    def same_until_death(self) -> bool:
        """The as-is run's steps are the plugin run's up to the death: same series and same grad norms before it."""
        before = (self.died_at or len(self.as_is_series) + 1) - 1
        mine, theirs = self.as_is_series, self.series
        norms = [_norms(self.as_is)[:before], _norms(self.plugin)[:before]]
        return len(mine) >= before and mine == theirs[: len(mine)] and norms[0] == norms[1]

    @property
    def crossing(self) -> dict | None:
        """The first exp past FP32_EXP_MAX in the as-is run: which, where, and the log-probs there."""
        return crossing(self.as_is_series)

    @property
    def warned(self) -> list[int]:
        """The steps (rollout + 1) at which the plugin run's hook printed a `nanscope: warning:` line."""
        return [entry["rollout_id"] + 1 for entry in hook_log(self.plugin) if entry.get("warnings")]

    @property
    def warned_ahead(self) -> bool:
        """The plugin warned at least WARN_LEAD steps before as-is died."""
        return self.died_at is not None and bool(self.warned) and self.warned[0] <= self.died_at - WARN_LEAD

    @property
    def finite_steps(self) -> int:
        """The plugin run's steps with a finite optimizer grad norm on every rank."""
        finite = [sum(n is not None and math.isfinite(n) for n in r.optimizer_grad_norm) for r in self.plugin.ranks]
        return min(finite, default=0)

    @property
    def exp_overflow(self) -> list[int]:
        """Per step of the plugin run: tokens whose log-ratio the guard kept from overflowing (the step's
        nanscope/nan_guard/exp_overflow, added up over the ranks by the hook's vote and logged once a step)."""
        return [int(entry.get("nanscope/nan_guard/exp_overflow") or 0) for entry in hook_log(self.plugin)]

    @property
    def ok(self) -> bool:
        return (
            self.as_is.observed == "nan-check"
            and bool(self.as_is.frames_match_case)
            and self.died_at is not None
            and (self.crossing or {}).get("step") == self.died_at
            and self.plugin.observed == "completed"
            and self.plugin.params_finite
            and self.finite_steps == self.steps
            and self.warned_ahead
            and self.same_until_death
        )


def crossing(series: list[dict]) -> dict | None:
    """The first step whose entry has a log-ratio past FP32_EXP_MAX, and the first of slime's exps there."""
    for entry in series:
        for metric, name in EXPS.items():
            value = entry.get(metric)
            if value is not None and value > FP32_EXP_MAX:
                return {"exp": name, "metric": metric, "step": entry["step"], "log_ratio": value, **entry["at"][metric]}
    return None


def hook_log(rep: Repro) -> list[dict]:
    """What the plugin's hook logged, from the first rank that logged anything."""
    return next((record.hook_log for record in rep.ranks if record.hook_log), [])


def _last_stage(rep: Repro):
    """The record of the last stage's TP rank 0 (it holds the series and slime's reduced losses)."""
    last = [record for record in rep.ranks if record.holds_output_layer]
    return min(last, key=lambda record: record.tp) if last else None


def series_of(rep: Repro) -> list[dict]:
    """A run's headroom per step, as its last stage recorded it."""
    last = _last_stage(rep)
    return list(last.series) if last else []


def _norms(rep: Repro) -> list:
    """The optimizer's grad norm per completed step, as the first rank recorded it."""
    return rep.ranks[0].optimizer_grad_norm if rep.ranks else []


def run_natural(
    *,
    seed: int = 0,
    steps: int = DEFAULT_STEPS,
    lr: float = DEFAULT_LR,
    timeout_s: float = TIMEOUT_S,
    via: Launcher = Launcher(),
    progress: Callable[[str], None] | None = None,
) -> NaturalCheck:
    """The natural loop's as-is run, then its plugin run, in one launch of the harness; `progress(line)` after each
    step ("as-is run: step 3 of 40") and each run.

    CP 1 (the plugin's loss, called by slime as a custom loss, reads CP from megatron's parallel state, where the
    harness has none: it simulates CP at the loss; the as-is run matches it).
    """
    layout = Layout(cp=1)
    common = dict(natural=True, seed=seed, steps=steps, lr=lr)
    specs = [
        RunSpec(loss="as-is", **common),
        RunSpec(loss="safe", hook=True, plugin=True, **common),  # the plugin's loss through slime's custom loss
    ]
    with scratch.directory("nanscope-natural-") as out:
        launched = launcher.launch(
            specs,
            layout,
            timeout_s=timeout_s,
            rank_timeout_s=300.0,
            out_dir=out,
            loss_flags=case.loss_flags(),
            via=via,
            progress=_steps_done(progress),
        )
        as_is = from_run(launched.runs[0], launched, layout, expected="nan-check")
        plugin = from_run(launched.runs[1], launched, layout, expected="completed")
    notes = harness_notes(layout) + ["plugin: harness step k is rollout k-1 (one optimizer step per rollout)"]
    return NaturalCheck(seed=seed, steps=steps, lr=lr, as_is=as_is, plugin=plugin, wall_s=launched.wall_s, notes=notes)


def _steps_done(progress: Callable[[str], None] | None):
    """The launch's callback for `progress`: one line a step of the as-is run (0) and the plugin run (1)."""
    if progress is None:
        return None

    def done(run: int, step: int | None, steps: int | None) -> None:
        name = "as-is" if run == 0 else "plugin"
        progress(f"{name} run: step {step} of {steps}" if step is not None else f"{name} run done")

    return done


def differences(check: NaturalCheck) -> list[tuple[str, str, str]]:
    """(what, the case, the natural loop) for everything the loop does differently from the case's run."""
    from nanscope.megatron.environment import ToolEnv  # heavy: torch (the sizes live with the code that uses them)
    from nanscope.megatron.model import CASE_LR, TinyQwen3MoE

    c, m = case.config(), TinyQwen3MoE()
    env = ToolEnv(vocab_size=m.vocab_size)
    layout = check.as_is.layout
    group = c["n_samples_per_prompt"]
    lr = float(c.given["--lr"][0]) if "--lr" in c.given else CASE_LR
    return [
        ("model", f"Qwen3-235B-A22B: {c['num_layers']} layers, hidden {c['hidden_size']}, {c['num_experts']} experts "
                  f"top-{c['moe_router_topk']}, vocab {c['vocab_size']}",
         f"tiny Qwen3-MoE: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_experts} experts "
         f"top-{m.moe_router_topk}, vocab {m.vocab_size}; the reference model is its initial weights"),
        ("device", f"{c['actor_num_nodes'] * c['actor_num_gpus_per_node']} H100s, TP{c['tensor_model_parallel_size']} "
                   f"PP{c['pipeline_model_parallel_size']} CP{c['context_parallel_size']} "
                   f"EP{c['expert_model_parallel_size']}, NCCL",
         f"CPU, TP{layout['tp']} PP{layout['pp']} CP{layout['cp_loss_level']} DP{layout['dp']}, gloo"),
        ("sampler", "SGLang engines (their own kernels and batches: TIS corrects the gap)",
         "megatron-core itself: one forward-only pipeline pass per token for the whole group, across both stages "
         "(no KV cache); the policy that samples is the one the log-prob pass scores, so TIS stays near 1"),
        ("environment", f"{c['custom_generate_function_path']}: multi-turn tool calls",
         f"a toy tool: the last of {env.think_tokens} thinking tokens is the call; the tool's output, "
         f"{env.tool_tokens[0]}-{env.tool_tokens[1]} tokens from the upper half of the vocabulary, is inserted "
         "(loss_mask 0, rollout log-prob 0.0)"),
        ("reward", f"{c['custom_rm_path']}",
         f"a rule: the fraction of the {env.answer_tokens} answer tokens in the lower half of the vocabulary"),
        ("lengths", f"prompts up to the data's, responses up to {c['rollout_max_response_len']} tokens",
         f"prompt {env.prompt_tokens}, response {env.think_tokens} + {env.tool_tokens[0]}-{env.tool_tokens[1]} + "
         f"{env.answer_tokens} tokens"),
        ("batch", f"{c['rollout_batch_size']} prompts x {group} samples, global batch {c['global_batch_size']}: one "
                  "optimizer step per rollout",
         f"1 prompt x {group} samples, global batch {group}: one optimizer step per rollout"),
        ("learning rate", f"{lr:g}, constant", f"{check.lr:g}, constant ({check.lr / lr:.0f}x)"),
    ]  # fmt: skip
