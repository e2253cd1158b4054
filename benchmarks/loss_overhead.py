"""Safe loss vs as-is loss: forward + backward time and peak memory, as ratios measured side by side in one run.

    python benchmarks/loss_overhead.py                  # 8 samples x 512-2048 tokens, vocab 32k, on the CPU
    python benchmarks/loss_overhead.py --vocab 16384 --repeats 5
    python benchmarks/loss_overhead.py --device cuda --vocab 151936 --tokens 8192   # the issue-40 shape on a GPU
    python benchmarks/loss_overhead.py --ops --device meta    # ops each loss dispatches, instead of times

Both losses get the same case-flag args (GRPO, TIS, low_var_kl at coef 0) and the same healthy
batch, every tensor on `--device` (slime's batch lives on the GPU: tokens, masks, log-probs, advantages); runs
alternate as-is, safe, as-is, safe, ... so that machine load affects both alike. The figure is the median of the
per-pair ratios. On CUDA each run is bracketed by torch.cuda.synchronize() and its peak memory (above what was
allocated before it) is recorded.

--ops: instead of timing, the ops each loss dispatches in one forward + backward (views excluded: they launch no
kernel), counted by a TorchDispatchMode; an op counts when an output is on `--device`. On `meta` that is what a GPU
would run as kernels (the host's index building stays on the CPU, uncounted); on `cpu` every op is counted.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nanscope import case
from nanscope.loss import as_is, safe
from nanscope.loss.microbatch import Parallel, log_probs_and_entropy


def make_batch(n_samples: int, lo: int, hi: int, vocab: int, seed: int = 0, device="cpu", tokens: int | None = None):
    """A healthy batch (a quarter of each sample prompt, 80 % of response tokens trained) and its packed logits
    [1, T, vocab], on `device`; `tokens`: scale the drawn lengths to about this many packed tokens.

    Healthy: the old, reference and rollout log-probs are the current policy's (from the logits, at the case's
    temperature) plus noise of 0.3, so no log-ratio nears the guard's bound of 20 (where safe would differ)."""
    g = torch.Generator().manual_seed(seed)
    totals = torch.randint(lo, hi + 1, (n_samples,), generator=g).tolist()
    if tokens is not None:
        totals = [max(2, round(t * tokens / sum(totals))) for t in totals]
    responses = [t - t // 4 for t in totals]  # prompt = a quarter
    ids = [torch.randint(0, vocab, (t,), generator=g) for t in totals]
    masks = [(torch.rand(r, generator=g) < 0.8).float() for r in responses]
    batch = {
        "unconcat_tokens": ids,
        "total_lengths": totals,
        "response_lengths": responses,
        "loss_masks": masks,
        "advantages": [torch.full((r,), float(torch.randn(1, generator=g))) for r in responses],
    }
    logits = torch.randn(1, sum(totals), vocab, generator=g) * 4
    with torch.no_grad():
        logp, _ = log_probs_and_entropy(logits, batch, case.args().rollout_temperature, Parallel())
    for key in ("log_probs", "ref_log_probs", "rollout_log_probs"):
        batch[key] = list((logp + 0.3 * torch.randn(logp.shape, generator=g)).split(responses))
    moved = {k: [x.to(device) if isinstance(x, torch.Tensor) else x for x in v] for k, v in batch.items()}
    return moved, logits.to(device)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_once(module, args, batch, logits) -> tuple[float, int, float]:
    """(wall seconds, peak bytes above the start (0 off CUDA), this process's CPU seconds) of one forward + backward.

    On a shared CPU box the CPU seconds move less with other jobs' load than the wall time does."""
    x = logits.clone().requires_grad_(True)
    cuda = x.device.type == "cuda"
    _sync(x.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0, c0 = time.perf_counter(), time.process_time()
    loss, _, _ = module.loss_function(args, batch, 1, x, parallel=Parallel())
    loss.backward()
    _sync(x.device)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return seconds, (torch.cuda.max_memory_allocated() - base) if cuda else 0, cpu


class _Ops(TorchDispatchMode):
    """Non-view ops with an output on `device`, by name."""

    def __init__(self, device):
        super().__init__()
        self.device, self.counts = torch.device(device), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (list, tuple)) else [out]
        if not func.is_view and any(isinstance(t, torch.Tensor) and t.device.type == self.device.type for t in flat):
            self.counts[func._schema.name] += 1
        return out


def count_ops(module, args, batch, logits) -> collections.Counter:
    x = logits.clone().requires_grad_(True)
    with _Ops(x.device) as mode:
        loss, _, _ = module.loss_function(args, batch, 1, x, parallel=Parallel())
        loss.backward()
    return mode.counts


def configs(samples: int) -> dict:
    # The case's flags (zero KL and entropy coefficients), then every term weighted. safe is as-is inside
    # the plugin's guard, so both losses build the same graph: the ratio is the guards' own cost.
    return {
        "case flags (kl-loss-coef 0, entropy-coef 0)": case.args(global_batch_size=samples),
        "all terms on (kl-loss-coef 0.01, entropy-coef 0.001)": case.args(
            global_batch_size=samples, kl_loss_coef=0.01, entropy_coef=0.001
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--min-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=None, help="scale the samples' lengths to about this many tokens")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--device", default="cpu", help="where the batch, the logits and the loss live (default cpu)")
    p.add_argument("--ops", action="store_true", help="count the ops each loss dispatches instead (see above)")
    a = p.parse_args()
    batch, logits = make_batch(a.samples, a.min_tokens, a.max_tokens, a.vocab, device=a.device, tokens=a.tokens)
    threads = f"{torch.get_num_threads()} threads" if torch.device(a.device).type == "cpu" else a.device
    print(
        f"{a.samples} samples ({sum(batch['total_lengths'])} packed tokens, {sum(batch['response_lengths'])} response), "
        f"vocab {a.vocab}, {threads}, torch {torch.__version__}" + ("" if a.ops else f", {a.repeats} alternating pairs")
    )
    for name, args in configs(a.samples).items():
        if a.ops:
            ops = [count_ops(m, args, batch, logits) for m in (as_is, safe)]
            extra = ops[1] - ops[0]
            print(
                f"{name}: ops on {a.device}, as-is {sum(ops[0].values())}, safe {sum(ops[1].values())} "
                f"(+{sum(ops[1].values()) - sum(ops[0].values())}); the guard's: {dict(extra.most_common(8))}"
            )
            continue
        for module in (as_is, safe):  # warm-up
            time_once(module, args, batch, logits)
        pairs = [
            (time_once(as_is, args, batch, logits), time_once(safe, args, batch, logits)) for _ in range(a.repeats)
        ]
        ratios = [s[0] / x[0] for x, s in pairs]
        line = (
            f"{name}: as-is median {statistics.median(x[0] for x, _ in pairs) * 1e3:.1f} ms, safe median "
            f"{statistics.median(s[0] for _, s in pairs) * 1e3:.1f} ms; safe / as-is median ratio "
            f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )
        if logits.device.type == "cpu":
            cpu = [s[2] / x[2] for x, s in pairs]
            line += (
                f"; CPU seconds as-is median {statistics.median(x[2] for x, _ in pairs):.2f}, safe / as-is median "
                f"ratio {statistics.median(cpu):.3f} (min {min(cpu):.3f}, max {max(cpu):.3f})"
            )
        if logits.device.type == "cuda":
            peak = [max(x[1] for x, _ in pairs), max(s[1] for _, s in pairs)]
            logit_bytes = logits.numel() * logits.element_size()
            line += (
                f"; peak memory as-is {peak[0] / 2**30:.2f} GiB ({peak[0] / logit_bytes:.2f}x the logits), "
                f"safe {peak[1] / 2**30:.2f} GiB, safe / as-is {peak[1] / peak[0]:.4f}"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
