"""Measure safe vs as-is on healthy batches: the fix must not change a single healthy gradient.

python -m nanscope.equivalence --cases 200     # prints the maximum relative differences
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import torch

from nanscope import case, hazards
from nanscope.causes import catalogue
from nanscope.loss import as_is, microbatch, safe
from nanscope.loss.microbatch import Parallel


@dataclass(frozen=True)
class Case:
    """One healthy configuration to compare on: the case's loss flags with `flags` applied."""

    seed: int = 0
    cp_size: int = 1
    mask_p: float = 0.7  # probability that a token keeps loss_mask 1
    flags: dict = field(default_factory=dict)  # slime loss fields over the case's (facts.args.LOSS_FIELDS)


@dataclass(frozen=True)
class Difference:
    """max |safe - as_is| relative to max |as_is|, for the loss and for d loss / d logits."""

    loss: float
    grad: float


def compare(config: Case, vocab_size: int = 128) -> Difference:
    """Run both losses on one healthy batch (every CP rank) and return their relative differences."""
    policy = hazards.synthetic_policy(vocab_size, config.seed, logit_std=4.0)
    rollout = case.rollout(vocab_size, config.seed, n_samples=4)
    g = torch.Generator().manual_seed(config.seed)
    rollout.loss_masks = [(torch.rand(m.shape, generator=g) < config.mask_p).float() for m in rollout.loss_masks]
    args = case.args(global_batch_size=4, **config.flags)
    batch = hazards.build(catalogue.HEALTHY.name, policy, rollout, config.seed, temperature=args.rollout_temperature)
    full = hazards.packed_logits(policy, batch["unconcat_tokens"]).requires_grad_(True)
    results = []
    for module in (as_is, safe):
        loss_sum, grad_sum = 0.0, torch.zeros_like(full)
        for r in range(config.cp_size):
            par = Parallel(cp_rank=r, cp_size=config.cp_size, dp_cp_size=config.cp_size)
            local = microbatch.cp_local_logits(full, batch["total_lengths"], par)
            loss, _, _ = module.loss_function(args, microbatch.slice_for_cp(batch, par), 1, local, parallel=par)
            (grad,) = torch.autograd.grad(loss, full)
            loss_sum, grad_sum = loss_sum + loss.detach().double(), grad_sum + grad
        results.append((loss_sum, grad_sum.double()))
    (la, ga), (ls, gs) = results
    return Difference(
        loss=float((ls - la).abs() / la.abs().clamp_min(1e-30)),
        grad=float((gs - ga).abs().max() / ga.abs().max().clamp_min(1e-30)),
    )


def random_case(seed: int) -> Case:
    """A healthy configuration drawn from the space the equivalence claim covers."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]
    cp_size = pick([1, 2])  # drawn in this order: the cases stay the ones measured before
    flags = dict(
        rollout_temperature=pick([0.6, 0.8, 1.0]),
        kl_loss_type=pick(["kl", "k2", "k3", "low_var_kl"]),
        kl_loss_coef=pick([0.0, 0.01]),
        entropy_coef=pick([0.0, 0.001]),
        use_tis=pick([True, False]),
        eps_clip=pick([0.1, 0.2]),
        eps_clip_high=pick([0.2, 0.28]),
        calculate_per_token_loss=pick([False, True]),
    )
    return Case(seed=seed, cp_size=cp_size, mask_p=pick([0.3, 0.7, 1.0]), flags=flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200)
    args = parser.parse_args()
    diffs = [compare(random_case(s)) for s in range(args.cases)]
    print(
        f"{args.cases} healthy cases: max relative difference safe vs as-is: "
        f"loss {max(d.loss for d in diffs):.3g}, gradient {max(d.grad for d in diffs):.3g}"
    )


if __name__ == "__main__":
    main()
