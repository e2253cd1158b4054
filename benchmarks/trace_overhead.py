"""Sentinel overhead on a training step, and tracer replay vs torch.autograd.detect_anomaly.

    python benchmarks/trace_overhead.py                 # tiny Qwen3-MoE (fp32), 1 thread, ~2 min
    python benchmarks/trace_overhead.py --repeats 15 --samples-per-microbatch 1 --bf16
    python benchmarks/trace_overhead.py --against c6b3873   # also the sentinel of that commit, side by side
    valgrind --tool=callgrind --trace-children=yes --instr-atstart=no --collect-atstart=no --callgrind-out-file=/tmp/cg/cg.%p \
        python benchmarks/trace_overhead.py --instructions /tmp/cg --samples-per-microbatch 1 --against c6b3873

One process: a gloo group of one rank, megatron-core on CPU (nanscope.megatron.cpu), the tiny model of
nanscope.megatron.model (DDP + Float16Module when --bf16 + megatron's Adam), a healthy case-shaped
rollout group (hazards.case_rollout / build "healthy", log-probs from the model itself) packed into
micro-batches, and slime v0.1.0's loss through megatron's forward_backward_func.

Figures, all ratios measured side by side in one run (runs interleaved, medians of per-round ratios, and
the fastest round of each variant over the fastest plain round):
  sentinel:  (training step + Sentinel hooks + one Sentinel.read(grads=True)) / training step,
             where a training step is forward_backward_func + optimizer.step(); the sentinel in its steady
             state (installed, and its first step run, before the --steps timed steps: always-on means every
             step), plain and sentinel steps in alternating order from round to round;
  tracer:    forward_backward_func under Tracer(modules=[model], token_map) / plain forward_backward_func;
  anomaly:   forward_backward_func under detect_anomaly(check_nan=True) / plain forward_backward_func.
  --against REF: the same ratio for the Sentinel of nanscope.trace.sentinel at git revision REF,
             timed in the same rounds (plain, current and REF's steps in rotating order).
The sentinel's rounds run first, then the tracer's (fwd_bwd, tracer, anomaly).
The tracer only ever runs on a replay of one step, the sentinel on every step. Wall and process-CPU
clocks are both reported: on a shared, loaded machine the CPU clock is the steadier one.

--instructions DIR (under valgrind's callgrind, as above; needs gcc and valgrind's headers, ~5 min):
instructions executed by one steady-state training step (+ read) without a sentinel, with this one (also
with its module-output checks only and its gradient side only) and with REF's, counted between client
requests (a 3-line C helper built with gcc at start) and read back from the dumps in DIR. A load-independent figure: on a box shared with other jobs the timed ratios
scatter by +-30 % from round to round; the instruction counts do not move.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path


def make_step(bf16: bool, per_micro: int, seed: int = 0):
    """(train_step(), fwd_bwd(), model, batch): a healthy micro-batch list on the tiny model."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nanscope import case, hazards
    from nanscope.loss import as_is
    from nanscope.megatron import bootstrap
    from nanscope.megatron.model import TinyQwen3MoE

    vocab = TinyQwen3MoE().vocab_size
    model, _, optimizer = bootstrap.build_training(seed=seed, bf16=bf16)
    rollout = case.rollout(vocab, seed)

    def run(tokens: torch.Tensor) -> torch.Tensor:  # [S] -> logits [1, S, V], S padded to a multiple of 64
        padded = -(-tokens.numel() // 64) * 64
        x = torch.nn.functional.pad(tokens, (0, padded - tokens.numel())).unsqueeze(0)
        return model(input_ids=x, position_ids=None, attention_mask=None, labels=None)

    def policy(tokens):  # the model itself: the batch's log-probs match the model's (a healthy batch)
        with torch.no_grad():
            return [run(t)[0, : t.numel()].float() for t in tokens]

    batch = hazards.build("healthy", policy, rollout, seed)
    keys = ("unconcat_tokens", "total_lengths", "response_lengths", "loss_masks") + (
        "log_probs",
        "ref_log_probs",
        "rollout_log_probs",
        "advantages",
    )
    n = len(batch["total_lengths"])
    # slime's dynamic batching packs samples into one row per micro-batch (the case: 16384 tokens per GPU).
    micro = [{k: batch[k][i : i + per_micro] for k in keys} for i in range(0, n, per_micro)]
    seq_length = -(-max(sum(m["total_lengths"]) for m in micro) // 64) * 64
    args = case.args(global_batch_size=n)

    def loss(mb, logits):
        return as_is.loss_function(args, mb, len(micro), logits[:, : sum(mb["total_lengths"])].float())[:3]

    def forward_step(it, m):
        mb = next(it)
        return run(torch.cat(mb["unconcat_tokens"])), partial(loss, mb)

    def fwd_bwd():
        model.zero_grad_buffer()
        optimizer.zero_grad()
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro), model=[model],
            num_microbatches=len(micro), seq_length=seq_length, micro_batch_size=1, forward_only=False,
        )  # fmt: skip

    def train_step():
        fwd_bwd()
        ok, _, _ = optimizer.step()
        assert ok

    return train_step, fwd_bwd, model, batch


def sentinel_at(ref: str):
    """The Sentinel class of nanscope.trace.sentinel at git revision `ref` (trace/sentinel.py, or after the move to
    subpackages the module it re-exports), with the modules of nanscope.trace it imports at that revision: the
    package's files at `ref` as a package of their own, `trace_at_ref` (their imports of nanscope.trace renamed),
    side by side with this tree's."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    listing = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", ref, "src/nanscope/trace/"], capture_output=True, text=True, check=True
    )
    package = Path(tempfile.mkdtemp()) / "trace_at_ref"
    package.mkdir()
    for name in listing.stdout.split():  # flat before the subpackages (sentinels/, tracer/, ...), nested after
        if name.endswith(".py"):
            text = subprocess.run([*git, "show", f"{ref}:{name}"], capture_output=True, text=True, check=True).stdout
            target = package / Path(name).relative_to("src/nanscope/trace")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(re.sub(r"\bnanscope\.trace\b", package.name, text))
    sys.path.insert(0, str(package.parent))
    return importlib.import_module(f"{package.name}.sentinel").Sentinel


CALLGRIND_HELPER = """#include <valgrind/callgrind.h>
void on(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void off(const char *name) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT(name); }
"""


def count_instructions(out_dir: str, variants: dict, train_step, model) -> None:
    """Print the instructions of one training step (+ read) per variant (a Sentinel class or None), counted
    by callgrind."""
    import ctypes
    import gc
    import glob
    import os

    build = Path(tempfile.mkdtemp())
    (build / "cg.c").write_text(CALLGRIND_HELPER)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", build / "cg.so", build / "cg.c"], check=True)
    cg = ctypes.CDLL(str(build / "cg.so"))
    train_step()
    for name, cls in variants.items():
        s = cls([model]) if cls else None

        def step():
            train_step()
            if s:
                s.read(grads=True)

        step()  # the sentinel's first step (its slots) and warm caches: steady state, as timed above
        gc.collect()  # every variant's step starts from the same collector state
        cg.on()
        step()
        cg.off(name.encode())
        if s:
            s.remove()
    counts = {}
    for path in glob.glob(os.path.join(out_dir, f"*.{os.getpid()}.*")):
        text = Path(path).read_text(errors="replace")
        name = text.split("desc: Trigger: Client Request: ", 1)[1].split("\n", 1)[0]
        counts[name] = int(text.split("\nsummary: ", 1)[1].split("\n", 1)[0])
    base = counts.pop("plain")
    print(f"instructions of one training step: plain {base / 1e6:.1f} M")
    for name, n in counts.items():
        print(f"  {name}: {n / 1e6:.1f} M, {n / base:.3f}x")


def timed(fn) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds): CPU time is steadier on a loaded machine."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--repeats", type=int, default=10, help="rounds of (steps, sentinel steps), then of (fwd_bwd, tracer, anomaly)"
    )
    p.add_argument("--bf16", action="store_true", help="bf16 parameters as in the case (about 4x slower on CPU)")
    p.add_argument(
        "--samples-per-microbatch",
        type=int,
        default=8,
        help="samples packed per micro-batch (default 8: the whole group in one row, as slime's dynamic "
        "batching does; 1: one micro-batch per sample, the most hook calls per token)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier timings)")
    p.add_argument(
        "--steps", type=int, default=3, help="consecutive training steps timed per round, with and without the sentinel"
    )
    p.add_argument("--against", metavar="REF", help="also time the sentinel of git revision REF (before/after)")
    p.add_argument("--instructions", metavar="DIR", help="count instructions under callgrind instead (see above)")
    a = p.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from nanscope.megatron import bootstrap
    from nanscope.trace.sentinels.sentinel import Sentinel
    from nanscope.trace.tracer.locator import Tracer

    bootstrap.init()
    train_step, fwd_bwd, model, _ = make_step(a.bf16, a.samples_per_microbatch)

    if a.instructions:
        variants = {
            "plain": None,
            "sentinel": Sentinel,
            "sentinel, module outputs only": partial(Sentinel, params=False),
            "sentinel, gradients only": partial(Sentinel, include=lambda name, module: False),
        }
        if a.against:
            variants[f"sentinel at {a.against}"] = sentinel_at(a.against)
        return count_instructions(a.instructions, variants, train_step, model)

    def with_sentinel(cls=Sentinel):  # installed, run once (its first step makes its slots), removed: untimed
        s = cls([model])

        def step():
            train_step()
            if cls is Sentinel:
                outputs, gradients = s._outputs, s._gradients
                with_sentinel.checks = (outputs.forward.count, len(gradients.arrivals), len(gradients.screens.labels))
            s.read(grads=True)

        step()
        t = timed(lambda: [step() for _ in range(a.steps)])
        s.remove()
        return t

    def with_tracer():
        with Tracer(modules=[model]) as tr:
            t = timed(fwd_bwd)
        with_tracer.ops = tr.ops_seen
        return t

    def with_anomaly():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                return timed(fwd_bwd)

    def plain_steps():  # after an untimed step, as the sentinel's timed steps are
        train_step()
        return timed(lambda: [train_step() for _ in range(a.steps)])

    steps = [plain_steps, with_sentinel]
    if a.against:
        ref = sentinel_at(a.against)
        steps.append(lambda: with_sentinel(ref))

    def sentinel_round(i: int) -> dict:
        """Plain and sentinel steps in rotating order (no order bias)."""
        order = [(i + k) % len(steps) for k in range(len(steps))]
        return dict(zip(order, [steps[j]() for j in order]))

    for fn in (train_step, *steps[1:], fwd_bwd, with_tracer, with_anomaly):  # warm-up
        fn()
    # The sentinel's rounds first, then the tracer's: a replay's allocations do not disturb the steps' timings.
    sentinel_rows = [sentinel_round(i) for i in range(a.repeats)]
    tracer_rows = [(timed(fwd_bwd), with_tracer(), with_anomaly()) for _ in range(a.repeats)]
    rows = [(t[0], t[1], *r, t.get(2)) for t, r in zip(sentinel_rows, tracer_rows)]
    print(
        f"tiny Qwen3-MoE ({'bf16' if a.bf16 else 'fp32'}), 8 samples, {a.samples_per_microbatch} per micro-batch, "
        f"{torch.get_num_threads()} threads, {a.repeats} rounds, {with_tracer.ops} aten ops traced per forward_backward, "
        f"sentinel per step: {with_sentinel.checks[0]} module-output checks, {with_sentinel.checks[1]} parameter-gradient "
        f"arrivals, {with_sentinel.checks[2]} gradient-buffer screens"
    )
    for k, clock in enumerate(("wall", "cpu")):
        col = lambda j: [r[j][k] for r in rows]  # noqa: E731
        ratio = lambda j, base: [x / b for x, b in zip(col(j), col(base))]  # noqa: E731
        print(
            f"[{clock} clock] training step median {statistics.median(col(0)) / a.steps:.3f} s, "
            f"forward_backward median {statistics.median(col(2)):.3f} s"
        )
        for name, j, base in (
            ("sentinel: (step + read) / step", 1, 0),
            *([(f"sentinel at {a.against}: (step + read) / step", 5, 0)] if a.against else []),
            ("tracer:   replay / forward_backward", 3, 2),
            ("anomaly:  detect_anomaly / forward_backward", 4, 2),
        ):
            r = ratio(j, base)
            best = min(col(j)) / min(col(base))  # the least disturbed round of each: robust to other jobs
            print(f"  {name:45s} median {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f}), "
                  f"fastest / fastest {best:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
