"""One training step as slime v0.1.0 runs it, on the harness's model: the log-prob pass and train_one_step.

How slime's micro-batches map onto the local (no TransformerEngine) layer spec: slime packs a
micro-batch's samples into one row with PackedSeqParams (thd), which the local DotProductAttention
refuses (it asserts packed_seq_params is None). Here each sample is its own micro-batch, padded at the
end to a fixed length (causal attention: the padding never reaches the sample's logits), so attention
stays per sample as with thd; the loss sees slime's batch keys for one sample and `logits`
[1, S, vocab/tp] float32, the shape GPTModel returns without labels.

Context parallelism inside attention needs TransformerEngine, so CP is applied at the loss level only
(`Layout.cp`, default 2 as in the case): see `_cp_loss`.

Every function here runs inside a rank after `bootstrap.init`; `ctx` is the run's RunContext (`run.py`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func

from nanscope import loss
from nanscope.dumps import writers
from nanscope.facts import paths
from nanscope.facts.args import loss_args
from nanscope.facts.keys import PER_TOKEN, SAMPLE
from nanscope.loss import as_is, microbatch
from nanscope.trace.tracer import replay

if TYPE_CHECKING:
    from nanscope.megatron.context import RunContext


def seq_length_for(total_lengths: list[int], tp: int) -> int:
    """Fixed micro-batch length: the longest sample rounded up to a multiple of 64 * tp (SP splits it by tp)."""
    m = 64 * tp
    return max(m, -(-max(total_lengths) // m) * m)


def policy(ctx: RunContext, seq_length: int):
    """The model as a hazards.Policy: tokens per sample -> full-vocab logits [total_i, V] (T = 1).

    A collective: a forward-only pass of the pipeline schedule (one sample per micro-batch), the
    last stage all-gathers the vocab shards over TP, and the last stage's TP-rank-0 broadcasts
    the logits over the model-parallel group, so each rank builds the same batch.
    """
    import torch.distributed as dist  # heavy: torch.distributed and megatron-core, in the ranks only
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    model = ctx.model

    def run(tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        def forward_step(it, m):
            t = next(it)
            out = m(input_ids=_pad(t, seq_length).unsqueeze(0), position_ids=None, attention_mask=None, labels=None)

            def keep(logits, non_loss_data=True):
                full = gather_from_tensor_model_parallel_region(logits.float())  # [1, S, V]
                return full[0, : t.numel()].detach().clone()

            return out, keep

        model.eval()
        with torch.no_grad():
            store = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(tokens), model=[model],
                num_microbatches=len(tokens), seq_length=seq_length, micro_batch_size=1,
                forward_only=True, collect_non_loss_data=True,
            )  # fmt: skip
        model.train()
        src = last_stage_tp0()
        sizes = [t.numel() for t in tokens]
        buf = torch.cat(store) if dist.get_rank() == src else torch.empty(sum(sizes), ctx.vocab_size)
        dist.broadcast(buf, src=src, group=mpu.get_model_parallel_group())  # within this replica
        return list(buf.split(sizes))

    return run


class MicroBatches:
    """The step's micro-batches as slime's DataIterator hands them out: `offset` counts those taken, so setting it
    back replays them (the plugin's rerun does)."""

    def __init__(self, microbatches: list[dict]):
        self.microbatches, self.offset = microbatches, 0
        self.micro_batch_size = 1  # one sample per micro-batch: slime's static schedule, offset counting samples

    def get_next(self) -> tuple[int, dict]:
        index = self.offset
        self.offset += 1
        return index, self.microbatches[index]


def train_one_step(ctx: RunContext, batch: dict, seq_length: int, loss_module, step: int):
    """slime v0.1.0's train_one_step for one micro-batch per sample.

    1F1B schedule -> finalize_model_grads -> DDP bucket NaN check -> optimizer.step(). The global
    batch is split over data-parallel replicas (sample i -> replica i % dp); each replica runs its
    samples as micro-batches, slime's scaling uses the global batch size.

    Returns:
        (slime's reduced loss dict on the last stage else {}, the optimizer's grad norm,
         the local bucket grad norms before the step)
    """
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, in the ranks only

    model, optimizer, cp = ctx.model, ctx.optimizer, ctx.layout.cp
    n = len(batch["response_lengths"])
    dp, d = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    args = slime_args(ctx, n)
    micro = [_sample(batch, i) for i in range(d, n, dp)]
    num_microbatches = len(micro)
    model.zero_grad_buffer()
    optimizer.zero_grad()
    if ctx.hook is not None:  # slime calls the hook after zeroing the grads; step k is rollout k-1
        ctx.hook.before_train_step(
            args=args, rollout_id=step - 1, step_id=0, model=[model], optimizer=optimizer, opt_param_scheduler=None
        )

    def forward_step(it, m):
        index, mb = it.get_next()
        if ctx.tracer is not None:
            ctx.tracer.microbatch(index, replay.token_map(mb, packed_length=seq_length))
        tokens = _pad(mb["unconcat_tokens"][0], seq_length).unsqueeze(0)
        out = m(input_ids=tokens, position_ids=None, attention_mask=None, labels=None)
        if out.requires_grad:  # the sentinel's evidence: the gradient entering the model (no host sync)
            out.register_hook(lambda g: ctx.output_grads.append(torch.isfinite(g).all()))
        loss_func = partial(
            _cp_loss,
            loss_function=loss_module.loss_function,
            args=args,
            batch=mb,
            num_microbatches=num_microbatches,
            cp=cp,
        )
        return out, loss_func  # megatron calls loss_func(output_tensor)

    # looked up in this module at each step, as slime's train_one_step does: the plugin's rerun replaces it
    losses_reduced = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=MicroBatches(micro), model=[model],
        num_microbatches=num_microbatches, seq_length=seq_length, micro_batch_size=1, forward_only=False,
    )  # fmt: skip
    bucket_norms = bucket_grad_norms(model)
    if ctx.grads_path:
        torch.save({n: p.main_grad.detach().clone() for n, p in model.named_parameters()}, ctx.grads_path)
    if ctx.spec.compare_grads is not None:
        ctx.record.grad_diff = grad_diff(model, ctx.path("grads", run=ctx.spec.compare_grads))
    update_successful, grad_norm, _ = optimizer.step()
    assert update_successful
    model.zero_grad_buffer()  # release grads, as slime does
    optimizer.zero_grad()
    reduced = {}
    if mpu.is_pipeline_last_stage(ignore_virtual=True):
        keys = losses_reduced[0]["keys"]
        values = sum(x["values"] for x in losses_reduced)
        torch.distributed.all_reduce(values, group=mpu.get_data_parallel_group(with_context_parallel=True))
        values = values.tolist()
        # slime: value * cp_size / num_samples (num_samples counted once per CP rank)
        reduced = {k: v * cp / values[0] for k, v in zip(keys, values[1:])}
    return reduced, grad_norm, bucket_norms


def grad_diff(model, path) -> float | None:
    """max |main_grad - saved| over every parameter (float64), against the grads an earlier run saved at `path`
    (`train_one_step`'s format); None when that run saved none on this rank."""
    if not path.exists():
        return None
    saved = torch.load(path, weights_only=True)
    worst = 0.0
    for name, p in model.named_parameters():
        a, b = p.main_grad.detach().double(), saved[name].double()
        worst = max(worst, float((a - b).abs().max()) if a.numel() else 0.0)
    return worst


def slime_args(ctx: RunContext, n: int):
    """slime's args for a step of n samples: the case's loss flags and the step's hazard's (a flag value,
    e.g. zero-temperature's); a plugin run adds what its launch script would (the custom loss when the
    run's loss is the fix, the debug rollout paths)."""
    args = loss_args(**{**ctx.loss_flags, "global_batch_size": n, **ctx.loss_overrides})
    if ctx.spec.plugin:
        if loss.get(ctx.spec.loss) is not as_is:  # the fix: slime's --loss-type custom_loss, the plugin's loss
            args.loss_type, args.custom_loss_function_path = "custom_loss", paths.LOSS_FUNCTION_PATH
        args.save_debug_rollout_data, args.load_debug_rollout_data = ctx.rollouts, ctx.spec.load_rollouts
    return args


def save_rollout(path: str, batch: dict, rollout_id: int) -> None:
    """The batch as slime's --save-debug-rollout-data writes a rollout (`nanscope.dumps.writers`): Sample.to_dict()
    rows of the fields the plugin's replay reads, and the rollout log-probs."""
    columns = zip(batch["unconcat_tokens"], batch["response_lengths"], batch["loss_masks"], batch["rollout_log_probs"])
    samples = [
        {
            "index": i,
            "tokens": tokens.tolist(),
            "response_length": response_length,
            "loss_mask": loss_mask.int().tolist(),
            "rollout_log_probs": rollout_logp.float().tolist(),
        }
        for i, (tokens, response_length, loss_mask, rollout_logp) in enumerate(columns)
    ]
    writers.write_rollout_dump(path, samples, rollout_id)


def _cp_loss(logits, *, loss_function, args, batch, num_microbatches, cp):
    """The loss of one sample as `cp` context-parallel ranks compute it, summed, from whole logits.

    logits [1, S, V/tp]: the sample's `total` positions then padding (slime pads its packed row to a
    multiple of 128 and slices by total_lengths); the padding is dropped first (its gradient is
    zero). For cp > 1, CP rank r gets chunks r and 2cp-1-r of the sample (zigzag, chunk =
    ceil(total / 2cp), zero-padded) and its slice of the batch (`microbatch.slice_for_cp`), exactly
    as slime hands them to the loss on a real CP rank.

    Scaling: on a real CP rank slime multiplies by dp*cp and DDP averages over dp*cp; here DDP averages
    over dp only, so the CP ranks' losses are summed and divided by cp. The metric values are summed
    over CP ranks, as slime's all-reduce over the data-parallel-with-CP group does.
    """
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, in the ranks only

    total = batch["total_lengths"][0]
    logits = logits[:, :total]
    if cp == 1:
        return loss_function(args, batch, num_microbatches, logits)
    losses, values, keys, normalizer = [], 0, None, None
    for r in range(cp):
        par = microbatch.Parallel(
            tp_group=mpu.get_tensor_model_parallel_group(), cp_rank=r, cp_size=cp,
            dp_cp_size=mpu.get_data_parallel_world_size() * cp,
        )  # fmt: skip
        local = microbatch.cp_local_logits(logits, [total], par)
        sliced = microbatch.slice_for_cp(batch, par)
        loss, normalizer, log = loss_function(args, sliced, num_microbatches, local, parallel=par)
        losses.append(loss)
        values, keys = values + log["values"], log["keys"]
    return sum(losses) / cp, normalizer, {"keys": keys, "values": values}


def _sample(batch: dict, i: int) -> dict:
    """Sample i of a slime batch as a one-sample micro-batch (same keys, lists of one)."""
    return {k: [batch[k][i]] for k in SAMPLE + PER_TOKEN if k in batch}


def _pad(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """[n] token ids -> [length], zeros at the end."""
    return torch.nn.functional.pad(tokens, (0, length - tokens.numel()), value=0)


def last_stage_tp0() -> int:
    """Global rank of (last pipeline stage, TP rank 0) in this rank's data-parallel replica."""
    import torch.distributed as dist  # heavy: torch.distributed and megatron-core, in the ranks only
    from megatron.core import parallel_state as mpu

    last_stage = mpu.get_pipeline_model_parallel_world_size() - 1
    last = dist.get_global_rank(mpu.get_pipeline_model_parallel_group(), last_stage)
    # `last` shares this rank's TP rank; step back to TP rank 0 of the same stage.
    return last - mpu.get_tensor_model_parallel_rank()


def bucket_grad_norms(model) -> list[float]:
    """L2 norm of every DDP bucket's local grad (dense buckets, then expert buckets), as check_grads computes it."""
    groups = list(model.bucket_groups) + list(model.expert_parallel_bucket_groups)
    return [float(b.grad_data.norm(p=2)) for g in groups for b in g.buckets]
