"""slime v0.1.0's train_one_step over a rank's list of model chunks: the layouts slime's flags make.

    chunks, config, optimizer = bootstrap.build_layout(seed=0, bf16=False, training=model.Training(vpp=2))
    scheduler = lr_schedule(optimizer)
    batch = hazards.build("healthy", log_prob_pass(chunks, seq_length), rollout, seed)
    grad_norm = train_one_step(chunks, optimizer, scheduler, batch, args=args, seq_length=..., hook=slime_plugin)

What `step.train_one_step` does for the harness's one chunk, for any number of chunks (one per virtual pipeline
stage: interleaved 1F1B needs a data iterator per chunk) and any of `model.Training`'s layouts: zero grads ->
the plugin's before_train_step -> megatron's schedule (looked up in `nanscope.megatron.step` at every call, as
slime looks it up in its model module: the plugin's rerun replaces it there) -> finalize_model_grads -> the
optimizer step (with megatron's check off, only when the gradients are finite) -> the scheduler step (slime
v0.1.0 model.py:259-335). One sample per micro-batch (the local
attention refuses THD packing), sample i on data-parallel replica i % dp; the loss is nanscope's model of
v0.1.0's loss_function (`loss.as_is`).
"""

from __future__ import annotations

from functools import partial

import torch

from nanscope.loss import as_is
from nanscope.megatron import step as schedules
from nanscope.megatron.step import MicroBatches


def log_prob_pass(chunks, seq_length: int, vocab_size: int):
    """The chunks as a hazards.Policy: tokens per sample -> full-vocab logits [total_i, V] on every rank.

    A collective: a forward-only pass of the schedule over the chunks, the last stage's last chunk all-gathers
    the vocabulary over TP, and the model-parallel group's (last stage, TP 0) broadcasts it.
    """
    import torch.distributed as dist  # heavy: torch.distributed and megatron-core, in the ranks only
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    def run(tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        def forward_step(it, m):
            t = next(it)
            out = m(input_ids=_pad(t, seq_length), position_ids=None, attention_mask=None, labels=None)

            def keep(logits, non_loss_data=True):
                return gather_from_tensor_model_parallel_region(logits.float())[0, : t.numel()].detach().clone()

            return out, keep

        for chunk in chunks:
            chunk.eval()
        with torch.no_grad():
            store = schedules.get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=[iter(tokens) for _ in chunks], model=chunks,
                num_microbatches=len(tokens), seq_length=seq_length, micro_batch_size=1, forward_only=True,
                collect_non_loss_data=True,
            )  # fmt: skip
        for chunk in chunks:
            chunk.train()
        src = schedules.last_stage_tp0()
        sizes = [t.numel() for t in tokens]
        buf = torch.cat(store) if dist.get_rank() == src else torch.empty(sum(sizes), vocab_size)
        dist.broadcast(buf, src=src, group=mpu.get_model_parallel_group())
        return list(buf.split(sizes))

    return run


def train_one_step(chunks, optimizer, scheduler, batch: dict, *, args, seq_length: int, hook=None, rollout_id=0):
    """slime v0.1.0's train_one_step on these chunks (see the module docstring).

    Args:
        batch: the global batch (slime's keys, one entry per sample); this replica trains samples d, d + dp, ...
        args: slime's args for the loss (global_batch_size the batch's size).
        hook: the plugin's module (nanscope.slime_plugin), or None.

    Returns:
        (the optimizer's grad norm, whether the optimizer reported an update).
    """
    from megatron.core import parallel_state as mpu  # heavy: megatron-core, in the ranks only

    n = len(batch["response_lengths"])
    dp, d = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    micro = [schedules._sample(batch, i) for i in range(d, n, dp)]
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    if hook is not None:
        hook.before_train_step(
            args=args, rollout_id=rollout_id, step_id=0, model=chunks, optimizer=optimizer,
            opt_param_scheduler=scheduler,
        )  # fmt: skip

    def forward_step(it, m):
        _, mb = it.get_next()
        out = m(input_ids=_pad(mb["unconcat_tokens"][0], seq_length), position_ids=None, attention_mask=None,
                labels=None)  # fmt: skip
        return out, partial(_loss, args=args, batch=mb, num_microbatches=len(micro))

    schedules.get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=[MicroBatches(micro) for _ in chunks], model=chunks,
        num_microbatches=len(micro), seq_length=seq_length, micro_batch_size=1, forward_only=False,
    )  # fmt: skip
    ok, grad_norm = _update(optimizer, args)
    if ok and scheduler is not None:
        scheduler.step(increment=n)
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    return grad_norm, ok


def _update(optimizer, args) -> tuple[bool, float]:
    """slime v0.1.0's update (model.py:315-330): with --no-check-for-nan-in-loss-and-grad a step whose gradients
    are not finite (found_inf, or a NaN or inf grad norm) is not applied; otherwise megatron's optimizer.step."""
    if not getattr(args, "check_for_nan_in_loss_and_grad", True):
        found_inf = optimizer.prepare_grads()
        grad_norm = None if found_inf else optimizer.get_grad_norm()
        if found_inf or not torch.isfinite(torch.as_tensor(grad_norm)):
            return False, float("nan") if grad_norm is None else float(grad_norm)
    ok, grad_norm, _ = optimizer.step()
    return ok, grad_norm


def _loss(logits, *, args, batch, num_microbatches):
    """slime's loss_function on the sample's positions (the padding dropped: its gradient is zero)."""
    return as_is.loss_function(args, batch, num_microbatches, logits[:, : batch["total_lengths"][0]])


def lr_schedule(optimizer):
    """1e-6 decaying linearly to 0 over 64 samples: a step the schedule counts changes the next update."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # heavy: megatron-core

    for group in optimizer.param_groups:  # megatron's groups carry their own bounds (None here: use these)
        group.update(max_lr=1e-6, min_lr=0.0)
    return OptimizerParamScheduler(
        optimizer, init_lr=1e-6, max_lr=1e-6, min_lr=0.0, lr_warmup_steps=0, lr_decay_steps=64,
        lr_decay_style="linear", start_wd=0.1, end_wd=0.1, wd_incr_steps=64, wd_incr_style="constant",
    )  # fmt: skip


def _pad(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """[n] token ids -> [1, length], zeros at the end."""
    return torch.nn.functional.pad(tokens, (0, length - tokens.numel()), value=0).unsqueeze(0)
