"""What the plugin's per-step observation costs on a healthy step, as ratios measured side by side in one run.

    python benchmarks/plugin_overhead.py                     # 8 samples x 512-2048 tokens, vocab 32k
    python benchmarks/plugin_overhead.py --vocab 16384 --repeats 9
    python benchmarks/plugin_overhead.py --device cuda        # the loss and headroom on a GPU (the vote: gloo)
    valgrind --tool=callgrind --trace-children=yes --instr-atstart=no --collect-atstart=no \
        --callgrind-out-file=/tmp/cg/cg.%p python benchmarks/plugin_overhead.py --instructions /tmp/cg

Three figures, each the median over alternating rounds:

    loss watch   slime's loss (nanscope's model of v0.1.0: as_is.loss_function, forward + backward) with the
                 plugin's loss watch installed (it keeps the batch and the current per-token log-probs and entropy,
                 detached) against the same loss without it                       issue 21: <= 1% of the loss
    headroom     `slime_plugin.headroom.measure` over the step's micro-batches (the log-ratio maxima, the
                 train-rollout gap, the clamped tokens, on the loss's device) against the loss's time
                                                                                  issue 23: <= 1% of the loss
    vote         `slime_plugin.step_vote.exchange`: the step's one all-gather of every rank's row (the NaN-safe loss's
                 counter block in it, as the hook sends it), over 4 gloo processes on this box, against the loss's
                 time                                                             issue 22: <= 1% of a step

--instructions DIR (under callgrind, as above; needs gcc and valgrind's headers): the instructions of one
healthy training step through real megatron-core (trace_overhead.py's step: the tiny Qwen3-MoE, a gloo world
of 1, 8 samples packed in one micro-batch, slime v0.1.0's loss in megatron's schedule, DDP's bucket check, Adam)
against the same step with the loss watch installed, headroom.measure over what it saw, the vote
(`step_vote.exchange`, the all-gather and its host sync) and the rerun's record of what a pass advances
(`rerun.StepState`), each alone and all together: what the plugin adds to every step besides the sentinel
(whose cost trace_overhead.py measures). Instructions do not move with the box's load.

The loss stands in for a step here: on the case's model a step is the loss plus a 235B-parameter forward and
backward, so a cost under 1% of the loss alone is far under 1% of the step.

--device: where the batch, the logits, the loss and headroom.measure run (default cpu); on CUDA each timed part
is bracketed by torch.cuda.synchronize(). The vote is always measured over 4 gloo processes on this machine's CPU
(a GPU vote needs 4 devices).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch

from loss_overhead import make_batch  # the same healthy batch as loss_overhead.py (benchmarks/ is the path)
from nanscope import case
from nanscope.loss import as_is, guard, target
from nanscope.loss.microbatch import Parallel
from nanscope.slime_plugin import headroom, rerun, step_vote
from nanscope.slime_plugin.coords import Coords
from nanscope.slime_plugin.loss_watch import LossWatch


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def loss_time(args, batch, logits) -> float:
    x = logits.clone().requires_grad_(True)
    _sync(x.device)
    t0 = time.perf_counter()
    loss, _, _ = as_is.loss_function(args, batch, 1, x, parallel=Parallel())
    loss.backward()
    _sync(x.device)
    return time.perf_counter() - t0


def watched_time(args, batch, logits) -> tuple[float, float]:
    """(the loss's time under the loss watch, headroom.measure's time over what it saw)."""
    watch = LossWatch(target.model())
    try:
        t = loss_time(args, batch, logits)
        t0 = time.perf_counter()
        row = headroom.measure(watch.seen, watch.target, logits.device)
        float(row.sum())  # the vote reads the row: the host sync belongs to it (it waits for the row's kernels)
        return t, time.perf_counter() - t0
    finally:
        watch.remove()


def _vote_worker(rank: int, port: int, rounds: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=4)
    row = headroom.empty(torch.device("cpu"))
    counters = step_vote.Counters.total(guard.METRICS, [torch.zeros(len(guard.METRICS))] * 8, torch.device("cpu"))
    times = []
    for _ in range(rounds):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        step_vote.exchange(False, Coords(rank=rank), row, counters=counters)  # the row as the hook sends it
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times))
    torch.distributed.destroy_process_group()


def vote_time(rounds: int) -> float:
    queue = multiprocessing.get_context("spawn").Queue()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_vote_worker, args=(r, 29671, rounds, queue)) for r in range(4)]
    for p in procs:
        p.start()
    median = queue.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return median


def count_instructions(out_dir: str) -> None:
    """Print the instructions of one steady-state training step, plain and with the plugin's per-step
    observation (loss watch + headroom + vote), counted by callgrind between client requests."""
    import ctypes
    import gc
    import glob
    import subprocess
    import tempfile
    from pathlib import Path

    from nanscope.megatron import bootstrap
    from trace_overhead import CALLGRIND_HELPER, make_step  # benchmarks/ is the script's directory

    bootstrap.init()  # gloo world of 1: the vote's all-gather runs through torch.distributed
    train_step, _, model, _ = make_step(False, 8)
    build = Path(tempfile.mkdtemp())
    (build / "cg.c").write_text(CALLGRIND_HELPER)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", build / "cg.so", build / "cg.c"], check=True)
    cg = ctypes.CDLL(str(build / "cg.so"))

    routers = rerun.router_state([model])  # once per installation, as ScheduleWatch finds them

    def observed(measure: bool = True, vote: bool = True, watch: bool = True, record: bool = True):
        def step():
            seen = LossWatch(target.model()) if watch else None
            try:
                if record:  # what the rerun records before every training schedule call (RNG, routers, offsets)
                    rerun.StepState(routers, None)
                train_step()
                row = headroom.empty(torch.device("cpu"))
                if measure:
                    row = headroom.measure(seen.seen, seen.target, torch.device("cpu"))
                if vote:
                    counts = step_vote.Counters.total(guard.METRICS, [], torch.device("cpu"))
                    step_vote.exchange(False, Coords(rank=0), row, counters=counts)
            finally:
                if seen is not None:
                    seen.remove()

        return step

    variants = {
        "plain": train_step,
        "loss watch": observed(measure=False, vote=False, record=False),
        "loss watch + headroom": observed(vote=False, record=False),
        "vote": observed(measure=False, watch=False, record=False),
        "rerun's step record": observed(measure=False, vote=False, watch=False),
        "loss watch + headroom + vote + rerun's step record": observed(),
        "plain again": train_step,
    }
    for name, step in variants.items():
        step()  # warm caches: steady state
        gc.collect()
        cg.on()
        step()
        cg.off(name.encode())
    counts = {}
    for path in glob.glob(os.path.join(out_dir, f"*.{os.getpid()}.*")):
        text = Path(path).read_text(errors="replace")
        name = text.split("desc: Trigger: Client Request: ", 1)[1].split("\n", 1)[0]
        counts[name] = int(text.split("\nsummary: ", 1)[1].split("\n", 1)[0])
    base = counts["plain"]
    print(
        f"instructions of one training step: plain {base / 1e6:.1f} M, plain again {counts['plain again'] / 1e6:.1f} M"
    )
    for name in list(variants)[1:-1]:
        print(f"  with {name}: {counts[name] / 1e6:.1f} M, {counts[name] / base:.4f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--min-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--instructions", metavar="DIR", help="count instructions under callgrind instead (see above)")
    p.add_argument("--device", default="cpu", help="where the loss and headroom run (default cpu; see above)")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.instructions:
        return count_instructions(a.instructions)
    batch, logits = make_batch(a.samples, a.min_tokens, a.max_tokens, a.vocab, device=a.device)
    args = case.args(global_batch_size=a.samples)
    loss_time(args, batch, logits)  # warm-up
    watch_ratios, headroom_ratios, plain = [], [], []
    for _ in range(a.repeats):
        base = loss_time(args, batch, logits)
        watched, measured = watched_time(args, batch, logits)
        plain.append(base)
        watch_ratios.append(watched / base)
        headroom_ratios.append(measured / base)
    vote = vote_time(rounds=200)
    loss_s = statistics.median(plain)
    tokens = sum(batch["response_lengths"])
    print(
        f"loss (as_is, fwd+bwd, {a.samples} samples, {tokens} response tokens, vocab {a.vocab}, on {a.device}): "
        f"{loss_s * 1e3:.1f} ms"
    )
    print(f"loss watch: {statistics.median(watch_ratios):.4f}x the loss (median of {a.repeats} alternating rounds)")
    print(f"headroom.measure: {statistics.median(headroom_ratios) * 100:.2f}% of the loss")
    print(f"vote (all-gather of one row, 4 gloo ranks): {vote * 1e6:.0f} us = {vote / loss_s * 100:.2f}% of the loss")


if __name__ == "__main__":
    main()
