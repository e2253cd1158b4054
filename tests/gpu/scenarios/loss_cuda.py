"""The loss on CUDA: nanscope's model of slime v0.1.0 as-is and through the plugin's guard (safe), every tensor on
the GPU as slime's batch is.

    python -m tests.gpu.scenario loss_cuda OUT.json [--vocabs 151936,32768] [--tokens 8192] [--repeats 7]

What it writes (`out`):

    bitwise    per flag set, safe's loss and d loss / d logits equal as-is's (torch.equal) on a healthy batch
    overflow   the case's hazard (a masked token whose reference log-prob exceeds the policy's by more than 88.72):
               as-is's gradient has NaN entries, safe's is finite and equals as-is's on the defused twin
    syncs      synchronizing CUDA calls of one forward + backward (torch.cuda.set_sync_debug_mode("warn")), as-is
               and safe, each with the file:line that made it; and whether safe ran under "error" (it must)
    timing     per vocabulary: the median of alternating as-is/safe pairs' time ratios and the peak memory ratio
               (peak above what was allocated before the call, each side's largest), with the medians in ms

Self-contained: it needs torch with CUDA and nanscope, nothing of the GPU tier's other scenarios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import traceback
import warnings

SYNC = "called a synchronizing CUDA operation"


def batch_on(device, n_samples: int, tokens: int, vocab: int, seed: int = 0):
    """A healthy case-shaped batch of about `tokens` packed tokens: (batch on `device`, logits [1, T, vocab]).

    Healthy: the old, reference and rollout log-probs are the current policy's (from the logits, at the case's
    temperature) plus noise of 0.3, so no log-ratio comes near the guard's bound of 20, where safe would differ.
    """
    import torch

    from nanscope import case
    from nanscope.loss.microbatch import Parallel, log_probs_and_entropy

    g = torch.Generator().manual_seed(seed)
    totals = torch.randint(512, 2049, (n_samples,), generator=g).tolist()
    totals = [max(8, round(t * tokens / sum(totals))) for t in totals]
    responses = [t - t // 4 for t in totals]
    batch = {
        "unconcat_tokens": [torch.randint(0, vocab, (t,), generator=g).to(device) for t in totals],
        "total_lengths": totals,
        "response_lengths": responses,
        "loss_masks": [(torch.rand(r, generator=g) < 0.8).int().to(device) for r in responses],
        "advantages": [torch.full((r,), float(torch.randn(1, generator=g))).to(device) for r in responses],
    }
    on_device = torch.Generator(device).manual_seed(seed)  # a case-sized [1, T, V] is drawn where it lives
    logits = torch.randn(1, sum(totals), vocab, generator=on_device, device=device) * 4
    with torch.no_grad():
        logp, _ = log_probs_and_entropy(logits, batch, case.args().rollout_temperature, Parallel())
    for key in ("log_probs", "ref_log_probs", "rollout_log_probs"):
        noisy = logp + 0.3 * torch.randn(logp.shape, generator=g).to(device)
        batch[key] = list(noisy.split(responses))
    return batch, logits


def leaf(logits):
    """A fresh copy of the logits that requires grad (made outside any timed or counted region)."""
    return logits.detach().clone().requires_grad_(True)


def forward_backward(module, args, batch, logits, x=None):
    """(loss, d loss / d logits) of one call; `x`: the leaf to use (default: a fresh copy of `logits`)."""
    from nanscope.loss.microbatch import Parallel

    x = leaf(logits) if x is None else x
    loss, _, _ = module.loss_function(args, batch, 1, x, parallel=Parallel())
    loss.backward()
    return loss.detach(), x.grad


def bitwise(device, tokens: int = 4096, vocab: int = 32768) -> dict:
    from nanscope import case
    from nanscope.loss import as_is, safe

    batch, logits = batch_on(device, 8, tokens, vocab, seed=1)
    flag_sets = {
        "case flags": {},
        "every term": dict(kl_loss_coef=0.01, entropy_coef=0.001),
        "per-token k3": dict(calculate_per_token_loss=True, kl_loss_type="k3", kl_loss_coef=0.01),
    }
    out = {}
    for name, flags in flag_sets.items():
        args = case.args(global_batch_size=8, **flags)
        (la, ga), (ls, gs) = (forward_backward(m, args, batch, logits) for m in (as_is, safe))
        out[name] = {"loss": bool(la.equal(ls)), "grad": bool(ga.equal(gs)), "loss_value": float(la)}
    return out


def overflow(device) -> dict:
    import torch

    from nanscope import case, hazards
    from nanscope.loss import as_is, safe

    def hazard(defused: bool):
        policy = hazards.synthetic_policy(512, 0)
        batch = hazards.build("kl-exp-overflow", policy, case.rollout(512, 0), 0, defused=defused)
        site = batch.pop("hazard_site")
        batch.pop("rewards", None)
        moved = {k: [x.to(device) if isinstance(x, torch.Tensor) else x for x in v] for k, v in batch.items()}
        return moved, hazards.packed_logits(policy, batch["unconcat_tokens"]).to(device), site

    batch, logits, site = hazard(False)
    twin, _, _ = hazard(True)
    i, j = site
    args = case.args(global_batch_size=8)
    gap = float(batch["ref_log_probs"][i][j] - batch["log_probs"][i][j])  # the old policy's log-prob stands near logp
    _, g_as_is = forward_backward(as_is, args, batch, logits)
    loss, g_safe = forward_backward(safe, args, batch, logits)
    _, g_twin = forward_backward(as_is, args, twin, logits)
    return {
        "site": [i, j], "masked": bool(batch["loss_masks"][i][j] == 0), "ref_minus_old": gap,
        "as_is_nan_grad_entries": int(torch.isnan(g_as_is).sum()), "safe_loss_finite": bool(torch.isfinite(loss)),
        "safe_grad_finite": bool(torch.isfinite(g_safe).all()), "safe_equals_as_is_on_defused": bool(g_safe.equal(g_twin)),
    }  # fmt: skip


def _where(stack) -> str:
    """Where a call was made: `nanscope/<module path>:<line>` for the innermost frame of nanscope's package, else
    the innermost frame outside torch (slime's loss, this scenario) as path:line."""
    import nanscope

    package = os.path.dirname(nanscope.__file__) + os.sep
    frames = [f for f in stack if f"{os.sep}torch{os.sep}" not in f.filename and not f.filename.endswith("warnings.py")]
    ours = [f for f in frames if f.filename.startswith(package)]
    if ours:
        return f"nanscope/{ours[-1].filename[len(package) :]}:{ours[-1].lineno}"
    f = (frames or stack)[-1]
    return f"{f.filename}:{f.lineno}"


def count_syncs(fn) -> list[str]:
    """fn() under torch.cuda.set_sync_debug_mode("warn"): where each synchronizing call was made."""
    import torch

    found = []

    def show(message, category, filename, lineno, file=None, line=None):
        if SYNC in str(message):
            found.append(_where(traceback.extract_stack()[:-1]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return found


def syncs(device) -> dict:
    import torch

    from nanscope import case
    from nanscope.loss import as_is, safe

    batch, logits = batch_on(device, 8, 8192, 32768, seed=2)
    args = case.args(global_batch_size=8)
    for module in (as_is, safe):  # warm-up: the caching allocators (device and pinned host) hold their blocks
        forward_backward(module, args, batch, logits)
    torch.cuda.synchronize()
    out = {}
    for name, module in (("as_is", as_is), ("safe", safe)):
        x = leaf(logits)
        out[name] = count_syncs(lambda m=module, x=x: forward_backward(m, args, batch, logits, x))
    x = leaf(logits)
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward_backward(safe, args, batch, logits, x)
        out["safe_under_error_mode"] = "ran"
    except RuntimeError as e:
        out["safe_under_error_mode"] = f"{type(e).__name__}: {e}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return out


def timing(device, vocab: int, tokens: int, repeats: int) -> dict:
    import torch

    from nanscope import case
    from nanscope.loss import as_is, safe

    batch, logits = batch_on(device, 8, tokens, vocab, seed=3)
    args = case.args(global_batch_size=8)

    def once(module) -> tuple[float, int]:
        x = leaf(logits)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        forward_backward(module, args, batch, logits, x)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, torch.cuda.max_memory_allocated() - base

    once(as_is), once(safe)  # warm-up
    pairs = [(once(as_is), once(safe)) for _ in range(repeats)]
    ratios = [s[0] / a[0] for a, s in pairs]
    peak = (max(a[1] for a, _ in pairs), max(s[1] for _, s in pairs))
    logit_bytes = logits.numel() * logits.element_size()
    return {
        "tokens": sum(batch["total_lengths"]), "pairs": repeats,
        "as_is_ms": statistics.median(a[0] for a, _ in pairs) * 1e3, "safe_ms": statistics.median(s[0] for _, s in pairs) * 1e3,
        "time_ratio": statistics.median(ratios), "time_ratio_min": min(ratios), "time_ratio_max": max(ratios),
        "peak_as_is_bytes": peak[0], "peak_safe_bytes": peak[1], "peak_ratio": peak[1] / peak[0],
        "peak_as_is_over_logits": peak[0] / logit_bytes,
    }  # fmt: skip


def main(out: dict, args: list[str]) -> None:
    import torch

    p = argparse.ArgumentParser(prog="loss_cuda")
    p.add_argument("--vocabs", default="151936,32768")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(args)
    device = torch.device("cuda", torch.cuda.current_device())
    out["bitwise"] = bitwise(device)
    out["overflow"] = overflow(device)
    out["syncs"] = syncs(device)
    out["timing"] = {v: timing(device, int(v), a.tokens, a.repeats) for v in a.vocabs.split(",")}
