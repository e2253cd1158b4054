"""One process, real megatron-core on CPU: the sentinel and the tracer around forward_backward_func.

    python tests/trace/megatron_worker.py OUT.json

The tiny Qwen3-MoE (fp32) under DDP with check_for_nan_in_grad; the kl-exp-overflow hazard's batch
built from the model's own log-probs (hazards.build with the model as policy), 8 samples packed into
2 micro-batches of 4; then a healthy batch with one inf weight in layer 2's input norm. Each pass
ends in megatron's "Unexpected result nan" (the DDP bucket check); the worker catches it and writes
the sentinel readings and the trace reports as JSON.
"""

from __future__ import annotations

import json
import sys
from functools import partial

PER_MICRO = 4


def main(out_path: str) -> None:
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nanscope import case, hazards
    from nanscope.facts.keys import PER_TOKEN, SAMPLE
    from nanscope.loss import as_is
    from nanscope.megatron import bootstrap
    from nanscope.megatron.model import TinyQwen3MoE
    from nanscope.trace.sentinels.sentinel import Sentinel
    from nanscope.trace.tracer import replay
    from nanscope.trace.tracer.locator import Tracer

    torch.set_num_threads(1)
    bootstrap.init(timeout_s=60)
    model, _, optimizer = bootstrap.build_training(seed=0, bf16=False)
    vocab = TinyQwen3MoE().vocab_size

    def run(tokens):  # [S] -> logits [1, S_padded, V]
        padded = -(-tokens.numel() // 64) * 64
        x = torch.nn.functional.pad(tokens, (0, padded - tokens.numel())).unsqueeze(0)
        return model(input_ids=x, position_ids=None, attention_mask=None, labels=None)

    def policy(tokens):
        with torch.no_grad():
            return [run(t)[0, : t.numel()].float() for t in tokens]

    batch = hazards.build("kl-exp-overflow", policy, case.rollout(vocab, 0), 0)
    keys = SAMPLE + PER_TOKEN
    n = len(batch["total_lengths"])
    micro = [{k: batch[k][i : i + PER_MICRO] for k in keys} for i in range(0, n, PER_MICRO)]
    seq_length = -(-max(sum(m["total_lengths"]) for m in micro) // 64) * 64
    args = case.args(global_batch_size=n)
    tracer = None

    def loss(mb, logits):
        return as_is.loss_function(args, mb, len(micro), logits[:, : sum(mb["total_lengths"])].float())[:3]

    def forward_step(it, m):
        index, mb = next(it)
        if tracer is not None:
            tracer.microbatch(index, replay.token_map(mb, packed_length=-(-sum(mb["total_lengths"]) // 64) * 64))
        return run(torch.cat(mb["unconcat_tokens"])), partial(loss, mb)

    def fwd_bwd() -> str:
        model.zero_grad_buffer()
        optimizer.zero_grad()
        try:
            get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(enumerate(micro)), model=[model],
                num_microbatches=len(micro), seq_length=seq_length, micro_batch_size=1, forward_only=False,
            )  # fmt: skip
        except RuntimeError as e:
            return str(e).splitlines()[0]
        return ""

    sentinel = Sentinel([model])
    error_sentinel = fwd_bwd()
    reading = sentinel.read(grads=True)
    sentinel.remove()

    with Tracer(modules=[model]) as t:
        tracer = t
        error_trace = fwd_bwd()
    report = t.report()

    # Second pass: a healthy batch, but one weight of layer 2's input norm is inf.
    healthy = hazards.build("healthy", policy, case.rollout(vocab, 0), 0)
    micro[:] = [{k: healthy[k][i : i + PER_MICRO] for k in keys} for i in range(0, n, PER_MICRO)]
    weight = model.module.decoder.layers[2].input_layernorm.weight
    with torch.no_grad():
        weight[5] = float("inf")
    tracer = None
    sentinel = Sentinel([model])
    poisoned_error = fwd_bwd()
    poisoned_reading = sentinel.read()
    sentinel.remove()
    with Tracer(modules=[model]) as t:
        tracer = t
        fwd_bwd()
    poisoned = t.report()

    with open(out_path, "w") as f:
        json.dump({
            "site": list(batch["hazard_site"]), "per_micro": PER_MICRO,
            "error_sentinel": error_sentinel, "error_trace": error_trace,
            "reading": reading.to_dict(), "trace": report.to_dict(),
            "param_names": [n for n, _ in model.named_parameters()],
            "poisoned_error": poisoned_error, "poisoned_reading": poisoned_reading.to_dict(), "poisoned_trace": poisoned.to_dict(),
        }, f)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
