"""One process, real megatron-core on CPU: the plugin's hook as slime v0.1.0's train_one_step calls it.

    python tests/workers/hook_worker.py OUT_DIR

The tiny Qwen3-MoE (fp32) under megatron's DDP (bucket NaN check on), Adam and a linearly decaying
learning rate (megatron's OptimizerParamScheduler); every step is one rollout of 8 samples (one
micro-batch each) built against the current model, trained like slime's train_one_step: zero grads
-> before_train_step -> 1F1B -> finalize_model_grads -> optimizer.step -> scheduler.step.
Scenarios, each on a freshly built model (so the hook reinstalls on new chunks):

  lifecycle  installing twice, then on new chunks, then uninstall(): hook counts and wrapped attributes
  skip       NANSCOPE_ON_NONFINITE=skip over [healthy, kl-exp-overflow, healthy]; and a run without the
             bad rollout's step, [healthy, healthy] on the same seeds: its final parameters
  max_skips  skip with NANSCOPE_MAX_SKIPS=2 over [bad, healthy, bad, bad]
  trace      NANSCOPE_TRACE_STEP=1:0 with --load-debug-rollout-data over [healthy, kl-exp-overflow]
  unwritable the report cannot be written (its path is taken by a directory), in skip mode over
             [healthy, bad, later] and in raise mode over [healthy, bad]: a warning, the run as without it

Writes OUT_DIR/result.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SEEDS = {"healthy": 1, "bad": 2, "later": 3}  # batch seeds: the bad one at rollout 1, the next healthy one


def main(out: Path) -> None:
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nanscope import case, hazards, slime_plugin
    from nanscope.loss import as_is
    from nanscope.megatron import bootstrap
    from nanscope.megatron.model import TinyQwen3MoE

    torch.set_num_threads(1)
    bootstrap.init()
    vocab = TinyQwen3MoE().vocab_size
    args = case.args(global_batch_size=8)
    args.load_debug_rollout_data = str(out / "rollout_data" / "{rollout_id}.pt")

    def run(model, tokens):  # [S] -> logits [1, S_padded, V]
        padded = -(-tokens.numel() // 64) * 64
        return model(
            input_ids=torch.nn.functional.pad(tokens, (0, padded - tokens.numel())).unsqueeze(0),
            position_ids=None,
            attention_mask=None,
            labels=None,
        )

    def batch_for(model, hazard, seed):
        def policy(tokens):
            with torch.no_grad():
                return [run(model, t)[0, : t.numel()].float() for t in tokens]

        batch = hazards.build(hazard, policy, case.rollout(vocab, seed), seed)
        return batch, batch.pop("hazard_site")

    def save_rollout(batch, rollout_id):  # slime's --save-debug-rollout-data: Sample.to_dict() rows
        samples = [
            {"tokens": t.tolist(), "response_length": r, "loss_mask": m.int().tolist()}
            for t, r, m in zip(batch["unconcat_tokens"], batch["response_lengths"], batch["loss_masks"])
        ]
        path = Path(args.load_debug_rollout_data.format(rollout_id=rollout_id))
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"rollout_id": rollout_id, "samples": samples}, path)

    def train_one_step(model, optimizer, scheduler, batch, rollout_id, hook=True):
        n = len(batch["response_lengths"])
        micro = [{k: [v[i]] for k, v in batch.items()} for i in range(n)]
        model.zero_grad_buffer()
        optimizer.zero_grad()
        if hook:
            slime_plugin.before_train_step(args, rollout_id, 0, [model], optimizer, scheduler)

        def forward_step(it, m):
            mb = next(it)
            loss = lambda logits: as_is.loss_function(args, mb, n, logits[:, : mb["total_lengths"][0]].float())  # noqa: E731
            return run(m, mb["unconcat_tokens"][0]), loss

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro),
            model=[model],
            num_microbatches=n,
            seq_length=256,
            micro_batch_size=1,
            forward_only=False,
        )
        ok, grad_norm, _ = optimizer.step()
        assert ok
        scheduler.step(increment=n)
        return grad_norm

    def train(hazards_at, hook=True, block_reports=False, **env):
        """A fresh model, then one rollout per entry of `hazards_at` ("healthy" / "bad" / "later"): a new job,
        whose plugin reads this environment at its first step."""
        slime_plugin.uninstall()
        reports = out / ("blocked" if block_reports else "reports")
        os.environ.update({"NANSCOPE_REPORT_DIR": str(reports), **env})
        if block_reports:  # the report of rollout 1 step 0 on rank 0 cannot be written: a directory has its name
            (reports / "rollout1_step0_rank0.json").mkdir(parents=True, exist_ok=True)
        model, _, optimizer = bootstrap.build_training(seed=0, bf16=False)
        scheduler = lr_schedule(optimizer)
        norms, error = [], None
        for rollout_id, name in enumerate(hazards_at):
            batch, site = batch_for(model, "kl-exp-overflow" if name == "bad" else "healthy", SEEDS[name])
            save_rollout(batch, rollout_id)
            try:
                norms.append(float(train_one_step(model, optimizer, scheduler, batch, rollout_id, hook)))
            except RuntimeError as e:
                error = str(e)
                break
        for k in env:
            del os.environ[k]
        return (
            model,
            optimizer,
            {
                "grad_norms": norms,
                "error": error,
                "site": site,
                "logged": slime_plugin.logged(),
                "skipped": slime_plugin.skipped_steps(),
                "reports": slime_plugin.reports(),
                "lr_steps": scheduler.num_steps,
            },
        )

    result = {"lifecycle": lifecycle(bootstrap, slime_plugin, args)}
    # and a misspelt variable beside it: ignored, with a warning at install naming the real one
    model, _, result["skip"] = train(
        ["healthy", "bad", "later"], NANSCOPE_ON_NONFINITE="skip", NANSCOPE_ONNONFINITE="x"
    )
    ref, _, result["without_bad_step"] = train(["healthy", "later"], hook=False)
    skipped_params, ref_params = dict(model.named_parameters()), dict(ref.named_parameters())
    result["params_finite"] = all(bool(torch.isfinite(p).all()) for p in skipped_params.values())
    result["params_equal"] = all(torch.equal(skipped_params[k], ref_params[k]) for k in ref_params)
    skip_two = {"NANSCOPE_ON_NONFINITE": "skip", "NANSCOPE_MAX_SKIPS": "2"}
    result["max_skips"] = train(["bad", "healthy", "bad", "bad"], **skip_two)[2]
    result["trace"] = train(["healthy", "bad"], NANSCOPE_TRACE_STEP="1:0")[2]
    result["files"] = {p: json.loads(Path(p).read_text()) for p in result["trace"]["reports"] if p.endswith(".json")}
    result["unwritable_skip"] = train(["healthy", "bad", "later"], block_reports=True, NANSCOPE_ON_NONFINITE="skip")[2]
    result["unwritable_raise"] = train(["healthy", "bad"], block_reports=True)[2]
    result["blocked"] = str(out / "blocked")
    slime_plugin.uninstall()
    (out / "result.json").write_text(json.dumps(result, indent=1))


def lr_schedule(optimizer):
    """1e-6 decaying linearly to 0 over 64 samples: a step the schedule counts changes the next update."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    for group in optimizer.param_groups:  # megatron's groups carry their own bounds (None here: use these)
        group.update(max_lr=1e-6, min_lr=0.0)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=1e-6,
        max_lr=1e-6,
        min_lr=0.0,
        lr_warmup_steps=0,
        lr_decay_steps=64,
        lr_decay_style="linear",
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=64,
        wd_incr_style="constant",
    )


def lifecycle(bootstrap, slime_plugin, args) -> dict:
    """Hook counts on the chunks and wrapped attributes after each install / uninstall."""

    def state(model, optimizer, scheduler):
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
        hooks += sum(len(p._backward_hooks or {}) for p in model.parameters())
        wrapped = {
            "finish_grad_sync": "finish_grad_sync" in vars(model),
            "step": "step" in vars(optimizer),
            "scheduler_step": "step" in vars(scheduler),
        }
        return {"hooks": hooks, **wrapped}

    a, _, opt_a = bootstrap.build_training(seed=0, bf16=False)
    b, _, opt_b = bootstrap.build_training(seed=0, bf16=False)
    sched_a, sched_b = lr_schedule(opt_a), lr_schedule(opt_b)
    out = {"a_before": state(a, opt_a, sched_a)}
    slime_plugin.before_train_step(args, 0, 0, [a], opt_a, sched_a)
    out["a_once"] = state(a, opt_a, sched_a)
    slime_plugin.before_train_step(args, 0, 1, [a], opt_a, sched_a)
    out["a_twice"] = state(a, opt_a, sched_a)
    slime_plugin.before_train_step(args, 1, 0, [b], opt_b, sched_b)
    out["a_after_b"], out["b_installed"] = state(a, opt_a, sched_a), state(b, opt_b, sched_b)
    slime_plugin.uninstall()
    out["b_after_uninstall"] = state(b, opt_b, sched_b)
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]))
