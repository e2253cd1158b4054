"""torchrun worker: call nanscope.slime_plugin.policy_loss as slime v0.1.0 does, under real
megatron-core parallel state on CPU, and write what it computed.

    torchrun --nproc-per-node 2 tests/workers/plugin_worker.py --tp 2 --out OUT_DIR
    torchrun --nproc-per-node 2 tests/workers/plugin_worker.py --cp 2 --out OUT_DIR

For each hazard: the packed full-vocab logits of a case-shaped batch are the same on every rank;
each rank takes its TP vocabulary shard / CP zigzag rows, runs slime's loss_function with
--loss-type custom_loss and the plugin path, and differentiates w.r.t. the full logits. The grads
are summed over ranks (all-reduce) and rank 0 writes loss, metrics and grad to OUT_DIR/<hazard>.pt.
"""

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    from nanscope.megatron import bootstrap

    bootstrap.init(tp=a.tp, cp=a.cp)
    from megatron.core import parallel_state as ps

    from nanscope import case, hazards
    from nanscope.causes import catalogue
    from nanscope.loss import as_is, microbatch
    from nanscope.loss.microbatch import Parallel

    par = Parallel.from_megatron()
    assert (par.cp_size, dist.get_world_size(par.tp_group)) == (a.cp, a.tp), par
    args = case.args(
        global_batch_size=8, loss_type="custom_loss", custom_loss_function_path="nanscope.slime_plugin.policy_loss"
    )
    for h in (h for h in catalogue.CATALOGUE if h.level == "batch" and h.safe_finite):
        policy = hazards.synthetic_policy(512, 0)
        batch = hazards.build(h.name, policy, case.rollout(512, 0), 0)
        full = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
        shard = 512 // a.tp
        tp_rank = ps.get_tensor_model_parallel_rank()
        local = microbatch.cp_local_logits(full, batch["total_lengths"], par)[
            ..., tp_rank * shard : (tp_rank + 1) * shard
        ]
        # slime's loss_function (modelled by as_is) reads parallel state itself, then calls the plugin
        loss, _, log = as_is.loss_function(args, microbatch.slice_for_cp(batch, par), 1, local)
        (grad,) = torch.autograd.grad(loss, full)
        # TP ranks compute the same loss, each differentiating its own vocabulary shard (the sum of
        # their grads is the full grad); CP ranks' pieces add up, each scaled by dp_cp = cp.
        values = log["values"].clone()
        dist.all_reduce(grad)
        if a.cp > 1:
            dist.all_reduce(values)
            total = loss.detach().clone()
            dist.all_reduce(total)
            loss_value, grad = total / a.cp, grad / a.cp
        else:
            loss_value = loss.detach()
        if dist.get_rank() == 0:
            torch.save(
                {"loss": loss_value, "grad": grad, "keys": log["keys"], "values": values},
                os.path.join(a.out, f"{h.name}.pt"),
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
