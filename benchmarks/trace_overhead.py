"""Sentinel overhead on a training step, and tracer replay vs torch.autograd.detect_anomaly.

    python benchmarks/trace_overhead.py                 # tiny Qwen3-MoE (fp32), 4 micro-batches, 1 thread, ~2 min
    python benchmarks/trace_overhead.py --repeats 9 --micro-batches 8 --bf16

One process: a gloo group of one rank, megatron-core on CPU (nanscope.megatron.cpu), the tiny model of
nanscope.megatron.model (DDP + Float16Module when --bf16 + megatron's Adam), a healthy case-shaped
rollout group (hazards.case_rollout / build "healthy") as micro-batches of one sample, and slime
v0.1.0's loss through megatron's forward_backward_func, as the harness runs it.

Figures, all ratios measured side by side in one run (runs interleaved, medians of per-round ratios):
  sentinel:  (training step + Sentinel hooks + one Sentinel.read(grads=True)) / training step,
             where a training step is forward_backward_func + optimizer.step();
  tracer:    forward_backward_func under Tracer(modules=[model], token_map) / plain forward_backward_func;
  anomaly:   forward_backward_func under detect_anomaly(check_nan=True) / plain forward_backward_func.
The tracer only ever runs on a replay of one step, the sentinel on every step. Wall and process-CPU
clocks are both reported: on a shared, loaded machine the CPU clock is the steadier one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import time
import warnings
from functools import partial


def setup():
    import torch.distributed as dist

    from nanscope.megatron import cpu

    cpu.install()
    from megatron.core import parallel_state as mpu

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    mpu.initialize_model_parallel(1, 1)


def make_step(bf16: bool, n_micro: int, seed: int = 0):
    """(train_step(), fwd_bwd(), model, batch): a healthy micro-batch list on the tiny model."""
    import torch
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nanscope import hazards
    from nanscope.loss import as_is
    from nanscope.megatron.model import TinyQwen3MoE, build_model, build_optimizer
    from nanscope.slime_args import case_args

    vocab = TinyQwen3MoE().vocab_size
    model, config = build_model(seed=seed, bf16=bf16)
    optimizer = build_optimizer(model, bf16=bf16)
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.timers = None
    rollout = hazards.case_rollout(vocab, seed)
    seq_length = -(-max(rollout.total_lengths) // 64) * 64

    def policy(tokens):  # the model itself: log-probs of the batch match the model's (healthy)
        with torch.no_grad():
            return [model(input_ids=torch.nn.functional.pad(t, (0, seq_length - t.numel())).unsqueeze(0), position_ids=None,
                          attention_mask=None, labels=None)[0, : t.numel()].float() for t in tokens]

    batch = hazards.build("healthy", policy, rollout, seed)
    keys = ("unconcat_tokens", "total_lengths", "response_lengths", "loss_masks") + ("log_probs", "ref_log_probs", "rollout_log_probs", "advantages")
    micro = [{k: [batch[k][i]] for k in keys} for i in range(min(n_micro, len(batch["total_lengths"])))]
    args = case_args(global_batch_size=len(micro))

    def loss(mb, logits):
        total = mb["total_lengths"][0]
        return as_is.loss_function(args, mb, len(micro), logits[:, :total].float())[:3]

    def forward_step(it, m):
        mb = next(it)
        tokens = torch.nn.functional.pad(mb["unconcat_tokens"][0], (0, seq_length - mb["total_lengths"][0])).unsqueeze(0)
        out = m(input_ids=tokens, position_ids=None, attention_mask=None, labels=None)
        return out, partial(loss, mb)

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


def timed(fn) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds): CPU time is steadier on a loaded machine."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="rounds (each: plain, sentinel, plain, tracer, anomaly)")
    p.add_argument("--bf16", action="store_true", help="bf16 parameters as in the case (about 4x slower on CPU)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step, one sample each (max 8)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier timings)")
    a = p.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from nanscope.trace import Sentinel, Tracer

    setup()
    train_step, fwd_bwd, model, _ = make_step(a.bf16, a.micro_batches)
    def with_sentinel():  # hooks registered and removed outside the timing
        s = Sentinel([model])
        t = timed(lambda: (train_step(), s.read(grads=True)))
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

    for fn in (train_step, with_sentinel, fwd_bwd, with_tracer, with_anomaly):  # warm-up
        fn()
    rows = [(timed(train_step), with_sentinel(), timed(fwd_bwd), with_tracer(), with_anomaly()) for _ in range(a.repeats)]
    print(f"tiny Qwen3-MoE ({'bf16' if a.bf16 else 'fp32'}), {a.micro_batches} micro-batches of one sample, "
          f"{torch.get_num_threads()} threads, {a.repeats} rounds, {with_tracer.ops} aten ops traced per forward_backward")
    for k, clock in enumerate(("wall", "cpu")):
        col = lambda j: [r[j][k] for r in rows]  # noqa: E731
        ratio = lambda j, base: [x / b for x, b in zip(col(j), col(base))]  # noqa: E731
        print(f"[{clock} clock] training step median {statistics.median(col(0)):.3f} s, "
              f"forward_backward median {statistics.median(col(2)):.3f} s")
        for name, j, base in (("sentinel: (step + read) / step", 1, 0), ("tracer:   replay / forward_backward", 3, 2),
                              ("anomaly:  detect_anomaly / forward_backward", 4, 2)):
            r = ratio(j, base)
            print(f"  {name:45s} median {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})")

if __name__ == "__main__":
    main()
