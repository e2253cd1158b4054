"""Safe loss vs as-is loss: forward + backward time, as a ratio measured side by side in one run.

    python benchmarks/loss_overhead.py                  # 8 samples x 512-2048 tokens, vocab 32k
    python benchmarks/loss_overhead.py --vocab 16384 --repeats 5

Both losses get the same case-flag args (GRPO, TIS, low_var_kl at coef 0) and the same healthy
batch; runs alternate as-is, safe, as-is, safe, ... so that machine load affects both alike. The
figure is the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nanscope import case
from nanscope.loss import as_is, safe
from nanscope.loss.microbatch import Parallel


def make_batch(n_samples: int, lo: int, hi: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    totals = torch.randint(lo, hi + 1, (n_samples,), generator=g).tolist()
    responses = [t - t // 4 for t in totals]  # prompt = a quarter
    tokens = [torch.randint(0, vocab, (t,), generator=g) for t in totals]
    masks = [(torch.rand(r, generator=g) < 0.8).float() for r in responses]
    lp = lambda r: -torch.rand(r, generator=g) * 3
    batch = {
        "unconcat_tokens": tokens,
        "total_lengths": totals,
        "response_lengths": responses,
        "loss_masks": masks,
        "log_probs": [lp(r) for r in responses],
        "ref_log_probs": [lp(r) for r in responses],
        "rollout_log_probs": [lp(r) for r in responses],
        "advantages": [torch.full((r,), float(torch.randn(1, generator=g))) for r in responses],
    }
    logits = torch.randn(1, sum(totals), vocab, generator=g) * 4
    return batch, logits


def time_once(module, args, batch, logits) -> float:
    x = logits.clone().requires_grad_(True)
    t0 = time.perf_counter()
    loss, _, _ = module.loss_function(args, batch, 1, x, parallel=Parallel())
    loss.backward()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--min-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    batch, logits = make_batch(a.samples, a.min_tokens, a.max_tokens, a.vocab)
    print(
        f"{a.samples} samples x {a.min_tokens}-{a.max_tokens} tokens ({sum(batch['total_lengths'])} packed), vocab {a.vocab}, "
        f"{torch.get_num_threads()} threads, {a.repeats} alternating pairs"
    )
    # The case's flags (zero KL and entropy coefficients), then every term weighted. safe is as-is inside
    # the plugin's guard, so both losses build the same graph: the ratio is the guards' own cost.
    configs = {
        "case flags (kl-loss-coef 0, entropy-coef 0)": case.args(global_batch_size=a.samples),
        "all terms on (kl-loss-coef 0.01, entropy-coef 0.001)": case.args(
            global_batch_size=a.samples, kl_loss_coef=0.01, entropy_coef=0.001
        ),
    }
    for name, args in configs.items():
        for module in (as_is, safe):  # warm-up
            time_once(module, args, batch, logits)
        pairs = [
            (time_once(as_is, args, batch, logits), time_once(safe, args, batch, logits)) for _ in range(a.repeats)
        ]
        ratios = [s / x for x, s in pairs]
        print(
            f"{name}: as-is median {statistics.median(x for x, _ in pairs):.3f} s, safe median "
            f"{statistics.median(s for _, s in pairs):.3f} s; safe / as-is median ratio {statistics.median(ratios):.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
