"""The natural loop on one rank: every step's batch sampled from the current policy, nothing planted, and the
step's headroom as the loss saw it.

    loop = NaturalLoop(ctx, loss_module)       # the model is built: its initial weights are the reference model
    batch, seq_length = loop.batch(ctx, i)     # the group sampled, the tool's spans, rewards, ref and old passes
    step.train_one_step(ctx, batch, seq_length, loop, i)   # loop.loss_function: the run's loss, log-probs kept
    entry = loop.entry(batch, i)               # the step's headroom maxima on the last stage, None elsewhere

Per step, in slime v0.1.0's order (actor.py `train`): the rollout (`sampler.sample_group`, the toy environment of
`environment.py`, a rule reward); the reference model's log-prob pass with its weights copied into the model
(`compute_log_prob("ref")`: update_gpu_params_dict), then the actor's with its own weights back; GRPO advantages
(`hazards.slime_batch`); then train. The reference model is the initial policy, as with --ref-load of the
checkpoint training starts from. No value is written into any tensor: every log-prob is a forward pass's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nanscope import hazards
from nanscope.facts.numerics import FP32_EXP_MAX
from nanscope.loss import headroom
from nanscope.loss.microbatch import Parallel, log_probs_and_entropy
from nanscope.megatron import sampler
from nanscope.megatron.environment import ToolEnv

if TYPE_CHECKING:
    from nanscope.megatron.context import RunContext

# The log-ratios slime v0.1.0's loss exponentiates under the case's flags, by the plugin's metric names.
RATIOS = ("max_kl_log_ratio", "max_ppo_log_ratio", "max_tis_log_ratio")


class NaturalLoop:
    """One run's natural loop on this rank: samples each step's batch and keeps what the loss saw.

    Passed to `step.train_one_step` as the loss module: `loss_function` calls the run's own (slime's loss, or
    slime's with the plugin's custom loss) and keeps the current policy's log-probs and entropy of the micro-batch's
    sample, detached, for `entry`.
    """

    def __init__(self, ctx: RunContext, loss_module):
        self.module = loss_module
        self.env = ToolEnv(vocab_size=ctx.vocab_size, seed=ctx.spec.seed)
        self.temperature = float(ctx.loss_flags["rollout_temperature"])
        self.group_size = int(ctx.loss_flags["n_samples_per_prompt"])
        # --ref-load: the checkpoint training starts from (slime keeps it on the host, `weights["ref"]`)
        self.ref = {name: p.detach().clone() for name, p in ctx.model.named_parameters()}
        self.group: sampler.Group | None = None
        self.seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # sample -> (log-probs, entropies), last stage
        self._samples: dict[int, int] = {}  # id of a sample's token tensor -> its index in the step's batch

    def batch(self, ctx: RunContext, i: int) -> tuple[dict, int]:
        """Step i's batch, sampled from the current policy, and the micro-batch length (a collective)."""
        from nanscope.megatron import step  # heavy: megatron-core, in the ranks only

        g = torch.Generator().manual_seed(ctx.spec.seed * 1_000_003 + i)
        group = sampler.sample_group(sampler.pipeline_next_logits(ctx), self.env, step=i, group_size=self.group_size,
                                     temperature=self.temperature, generator=g)  # fmt: skip
        rollout = group.rollout
        seq_length = step.seq_length_for(rollout.total_lengths, ctx.layout.tp)
        current = self._swap(ctx.model, self.ref)  # the reference model's pass, then the actor's
        ref = hazards.policy_log_probs(step.policy(ctx, seq_length)(rollout.tokens), rollout, self.temperature)
        self._swap(ctx.model, current)
        old = hazards.policy_log_probs(step.policy(ctx, seq_length)(rollout.tokens), rollout, self.temperature)
        batch = hazards.slime_batch(rollout, log_probs=old, ref_log_probs=ref,
                                    rollout_log_probs=group.rollout_log_probs, rewards=rollout.rewards)  # fmt: skip
        self.group, self.seen = group, {}
        self._samples = {id(tokens): k for k, tokens in enumerate(batch["unconcat_tokens"])}
        return batch, seq_length

    @staticmethod
    def _swap(model, weights: dict) -> dict:
        """Copy `weights` into the model's parameters; returns the ones they replace."""
        replaced = {}
        with torch.no_grad():
            for name, p in model.named_parameters():
                replaced[name] = p.detach().clone()
                p.copy_(weights[name])
        return replaced

    def loss_function(self, args, batch, num_microbatches, logits, **kwargs):
        """The run's loss_function, the sample's current log-probs and entropies kept first ([response] float32)."""
        with torch.no_grad():
            par = kwargs.get("parallel") or Parallel.from_megatron()
            logp, ent = log_probs_and_entropy(logits.detach(), batch, args.rollout_temperature, par)
        self.seen[self._samples[id(batch["unconcat_tokens"][0])]] = (logp, ent)
        return self.module.loss_function(args, batch, num_microbatches, logits, **kwargs)

    def entry(self, batch: dict, i: int) -> dict | None:
        """Step i's headroom over the samples this rank's loss saw (the last stage's), else None.

        Every log-ratio slime's loss exponentiates, as the loss saw it (logp: the training forward's): its maximum
        over every response token, masked ones too (slime computes exp on them), and where it is.
        """
        if not self.seen:
            return None
        samples = sorted(self.seen)
        logp = {k: self.seen[k][0] for k in samples}
        old, ref, rollout = ({k: batch[key][k].float() for k in samples}
                             for key in ("log_probs", "ref_log_probs", "rollout_log_probs"))  # fmt: skip
        masks = {k: batch["loss_masks"][k] for k in samples}
        ratios = {
            "max_kl_log_ratio": {k: headroom.kl_log_ratio(logp[k], ref[k]) for k in samples},
            "max_ppo_log_ratio": {k: headroom.ppo_log_ratio(logp[k], old[k]) for k in samples},
            "max_tis_log_ratio": {k: headroom.tis_log_ratio(old[k], rollout[k]) for k in samples},
        }
        trained = {k: masks[k] != 0 for k in samples}
        tool = {k: ~trained[k] for k in samples}
        out = {"step": i, "reward": sum(batch["rewards"]) / len(batch["rewards"]), "rewards": list(batch["rewards"])}
        out["entropy"] = _mean({k: self.seen[k][1] for k in samples}, trained)
        at = {}
        for name, per_sample in ratios.items():
            out[name], at[name] = self._largest(per_sample, logp, ref, old)
        gap = {k: headroom.train_rollout_gap(logp[k], rollout[k]) for k in samples}
        out["train_rollout_gap_max"] = _largest_value(gap, trained)
        out["max_kl_log_ratio_trained"] = _largest_value(ratios["max_kl_log_ratio"], trained)
        out["mean_kl_log_ratio_tool"] = _mean(ratios["max_kl_log_ratio"], tool)
        out["min_tool_log_prob"] = -_largest_value({k: -logp[k] for k in samples}, tool)
        over = [torch.stack([r[k] for r in ratios.values()]).max(dim=0).values > FP32_EXP_MAX for k in samples]
        out["exp_overflow"] = int(sum(int(o.sum()) for o in over))
        out["at"] = at
        return out

    def _largest(self, per_sample: dict, logp: dict, ref: dict, old: dict) -> tuple[float, dict | None]:
        """(the largest entry, its place) of per-sample [response] tensors; a NaN is the largest, as in
        `headroom.maximum`."""
        samples = list(per_sample)
        x = torch.cat([per_sample[k] for k in samples])
        if x.numel() == 0:
            return float("-inf"), None
        nan = torch.isnan(x)
        at = int(nan.int().argmax()) if nan.any() else int(x.argmax())
        ends = torch.tensor([per_sample[k].numel() for k in samples]).cumsum(0)
        n = int(torch.searchsorted(ends, at, right=True))
        k, j = samples[n], at - (int(ends[n - 1]) if n else 0)
        start, stop = self.group.spans[k]
        masked = bool(self.group.rollout.loss_masks[k][j] == 0)
        place = {"sample": k, "token": j, "masked": masked, "span": [start, stop] if masked else None,
                 "log_prob": float(logp[k][j]), "ref_log_prob": float(ref[k][j]), "old_log_prob": float(old[k][j])}  # fmt: skip
        return float(x[at]), place


def _largest_value(per_sample: dict, keep: dict) -> float:
    """The largest entry over the kept tokens of every sample (-inf for none)."""
    kept = [x[keep[k]] for k, x in per_sample.items()]
    values = torch.cat(kept) if kept else torch.zeros(0)
    return float(values.max()) if values.numel() else float("-inf")


def _mean(per_sample: dict, keep: dict) -> float:
    """The mean over the kept tokens of every sample (NaN for none)."""
    kept = [x[keep[k]].float() for k, x in per_sample.items()]
    values = torch.cat(kept) if kept else torch.zeros(0)
    return float(values.mean()) if values.numel() else float("nan")
